"""vLLM's scheduler defaults and semantics: ``max_num_seqs`` / ``max_num_batched_tokens`` per
GPU class as its OpenAI server sets them, and a request resumed after a preemption looked up
in the prefix cache again."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.simulator import engine_spec
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.errors import EngineSpecError


@pytest.mark.parametrize(
    ("spec", "seqs", "tokens"),
    [
        ("sim:llama-3.1-8b-fp8@h200_sxm:tp1", 1024, 8192),
        ("sim:llama-3.1-8b-fp8@h100_sxm:tp1", 1024, 8192),  # 80 GB = 74.5 GiB
        ("sim:llama-3.1-8b-fp8@b200:tp1", 1024, 8192),
        ("sim:llama-3.1-8b@a100_sxm:tp1", 256, 2048),  # 80 GB, but vLLM excludes the A100
        ("sim:llama-3.1-8b-fp8@h200_sxm:tp1:backend=sglang", 256, 8192),  # Dynamo's mocker
    ],
)
def test_batch_defaults_follow_vllm_per_gpu(spec: str, seqs: int, tokens: int) -> None:
    s = engine_spec.parse(spec)
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (seqs, tokens)
    assert ":seqs" not in str(s) and "max_num_seqs" not in str(s)  # the default is implied
    assert engine_spec.parse(str(s)) == s


def test_explicit_batch_limits_win_and_round_trip() -> None:
    s = engine_spec.parse("sim:llama-3.1-8b-fp8@h200_sxm:tp1:seqs=256:mnbt=2048")
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (256, 2048)
    assert engine_spec.parse(str(s)) == s


@pytest.mark.parametrize("option", ["seqs=0", "mnbt=0", "seqs=-3"])
def test_non_positive_batch_limits_are_refused(option: str) -> None:
    with pytest.raises(EngineSpecError, match="must be >= 1"):
        engine_spec.parse(f"sim:llama-3.1-8b-fp8@h200_sxm:tp1:{option}")


def _long_answers(n: int, seed: int) -> Iterator[TraceRequest]:
    """Prompts of two 512-token blocks of their own (no two requests share one, so a first
    admission never hits the cache) and long outputs: the engine's KV fills up and it
    preempts requests that have generated tokens."""
    rng = random.Random(seed)
    t = 0.0
    for i in range(n):
        t += rng.expovariate(8.0)
        yield TraceRequest(t, 2 * 512 - 1, rng.randint(800, 1600), (2 * i, 2 * i + 1))


def test_a_request_resumed_after_preemption_hits_the_prefix_cache() -> None:
    # About 18k KV tokens: preemption under this load; the prefix cache keeps its blocks
    tight = "sim:llama-3.1-8b-fp8@h100_sxm:tp1:mem=0.14:seqs=64"
    c = Cluster(mode="agg", engines={"agg": tight}, replicas={"agg": 1})
    c.submit(_long_answers(120, seed=3))
    c.run_to_completion()
    assert all(r.ok for r in c.records)
    resumed = [r for r in c.records if r.preemptions]
    assert resumed, "the engine should preempt under this load"
    # a first admission finds nothing (its blocks are its own); a resumed request finds the
    # prompt blocks its first prefill cached (the whole prompt, not what it generated), as
    # vLLM looks up every request with no computed tokens
    assert all(r.cached_tokens == 0 for r in c.records if not r.preemptions)
    assert sum(1 for r in resumed if r.cached_tokens == 2 * 512 - 1) > len(resumed) / 2
