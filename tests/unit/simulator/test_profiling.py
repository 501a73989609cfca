"""Profiling sweeps: the simulated engine and a real OpenAI-compatible HTTP endpoint (a small
server in this file) produce Dynamo-layout profiles the interpolation library loads."""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from disagg_planner.cli.profile_sweep import add_sweep_arguments, run_sweep
from disagg_planner.errors import SpecError, classify
from disagg_planner.profiles import load_manifest, load_profile
from disagg_planner.simulator.errors import ProfilingError
from disagg_planner.simulator.profiling import SimulatedEngine, SweepConfig, bundled_path
from disagg_planner.simulator.profiling import run_sweep as sweep


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_sweep_arguments(parser)
    return parser.parse_args(argv)


def test_simulated_sweep_writes_a_loadable_modelled_profile(tmp_path, capsys):
    out = tmp_path / "prof"
    args = parse(
        [
            "--engine",
            "sim:llama-3.1-8b-fp8@h200_sxm:tp1",
            "--granularity-prefill",
            "5",
            "--granularity-decode",
            "3",
            "--granularity-concurrency",
            "3",
            "--max-context-length",
            "4096",
            "--decode-osl",
            "64",
            "-o",
            str(out),
        ]
    )
    assert run_sweep(args) == 0
    printed = capsys.readouterr()
    assert "5 prefill and 9 decode points" in printed.out
    # The default max_num_seqs (256) holds far less than 0.95 of the KV cache at 256 tokens.
    assert "warning: max_num_seqs cuts the decode sweep short of KV usage 0.95" in printed.err
    profile = load_profile(out)
    pre, dec = profile.prefill.data, profile.decode.data
    # ISLs spaced geometrically from 100 to the context: short prompts are sampled densely.
    assert pre.isl[0] == 100 and pre.isl[-1] == 4095 and pre.isl.size == 5
    np.testing.assert_allclose(pre.isl[1:] / pre.isl[:-1], (4095 / 100) ** 0.25, rtol=0.01)
    contexts = np.unique(dec.context_length)
    assert contexts.size == 3 and contexts[0] == 256 and contexts[-1] > 4000
    assert np.all(np.diff(pre.ttft_ms) > 0)
    np.testing.assert_allclose(pre.thpt_per_gpu, pre.isl / (pre.ttft_ms / 1000), rtol=1e-9)
    assert profile.max_kv_tokens > 1_000_000
    for ctx in np.unique(dec.context_length):
        rows = dec.context_length == ctx
        order = np.argsort(dec.kv_usage[rows])
        assert np.all(np.diff(dec.itl_ms[rows][order]) > 0)  # more load, slower steps
    manifest = load_manifest(out / "profile.yaml")
    assert manifest.source == "modelled"
    assert (manifest.model, manifest.gpu, manifest.backend) == (
        "llama-3.1-8b-fp8",
        "h200_sxm",
        "vllm",
    )
    assert manifest.kv_block_size == 16 and manifest.engine.tp == 1
    assert (
        manifest.tool is not None and "--engine sim:llama-3.1-8b-fp8@h200_sxm:tp1" in manifest.tool
    )


def test_simulated_decode_point_matches_the_engine_model():
    engine = SimulatedEngine("sim:llama-3.1-8b-fp8@h200_sxm:tp1")
    point = engine.decode_point(3000, 150, concurrency=64, measured=128)
    # Some of the 64 in flight are in prefill or KV transfer, not in the decode batch.
    assert 50 < point.running < 64
    lo, hi = int(point.running), int(point.running) + 1
    w = point.running - lo
    step = 1000 * (
        engine.model.decode_step_time_s(lo, 3075) * (1 - w)
        + engine.model.decode_step_time_s(hi, 3075) * w
    )
    # Steady state: mostly pure decode steps, a few 1-token admissions.
    assert point.itl_ms == pytest.approx(step, rel=0.02)


def test_a_short_output_decode_point_counts_the_arrivals_in_its_batch():
    # At 26 output tokens a request joins the decode batch every few steps, its last prompt
    # token recomputed in the same step: the step's batch has those rows too. Counting only the
    # decoding requests paired the step time with a smaller batch (+3.6% against the engine).
    engine = SimulatedEngine("sim:llama-3.1-8b-fp8@h200_sxm:tp1:seqs=8192")
    point = engine.decode_point(243, 26, concurrency=700, measured=700)
    lo = int(point.running)
    w = point.running - lo
    step = 1000 * (
        engine.model.decode_step_time_s(lo, 256) * (1 - w)
        + engine.model.decode_step_time_s(lo + 1, 256) * w
    )
    assert point.itl_ms == pytest.approx(step, rel=0.005)
    assert point.preemptions == 0


def test_a_decode_point_that_preempts_says_so():
    # About 18k KV tokens: 30 requests of 1,000 + 1,000 tokens cannot all stay resident.
    engine = SimulatedEngine("sim:llama-3.1-8b-fp8@h100_sxm:tp1:mem=0.14:seqs=64")
    assert engine.decode_point(1000, 1000, concurrency=30, measured=30).preemptions > 0
    assert engine.decode_point(1000, 100, concurrency=4, measured=4).preemptions == 0


def test_bundled_path_layout():
    e = SimulatedEngine("sim:deepseek-r1@gb200:tp1:dp16")
    assert (
        bundled_path("profiles", e.spec).as_posix()
        == "profiles/gb200/vllm/deepseek-v3/tp1-dp16-ep16"
    )


# --- a fake OpenAI-compatible engine -------------------------------------------------------------


class FakeEngine:
    """TTFT = 2 ms + 5 us per prompt token; one token every 1 ms + 1 ms per request in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.prompts: list[list[int]] = []
        self.bodies: list[dict] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                text = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="40"} 1.0\n'
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(text.encode())

            def do_POST(self) -> None:
                if self.path != "/v1/completions":
                    self.send_error(404)
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body.get("model") != "fake-model":
                    self.send_response(404)
                    self.end_headers()
                    self.wfile.write(b'{"error": "model not found"}')
                    return
                with engine.lock:
                    engine.prompts.append(body["prompt"])
                    engine.bodies.append(body)
                    engine.active += 1
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    time.sleep(0.002 + 5e-6 * len(body["prompt"]))
                    n = body["max_tokens"]
                    for i in range(n):
                        if i:
                            with engine.lock:
                                active = engine.active
                            time.sleep(0.001 + 0.001 * active)
                        chunk = {"choices": [{"index": 0, "text": f" t{i}"}]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    usage = {"choices": [], "usage": {"completion_tokens": n}}
                    self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
                finally:
                    with engine.lock:
                        engine.active -= 1

        return Handler


@pytest.fixture
def fake_server() -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine()
    server = ThreadingHTTPServer(("127.0.0.1", 0), engine.handler())
    server.daemon_threads = True
    # polled every 0.05 s, not 0.5 s: shutdown() waits for the loop to see it
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", engine
    finally:
        server.shutdown()
        server.server_close()


def test_endpoint_sweep_measures_ttft_and_itl_from_the_stream(tmp_path, fake_server):
    url, engine = fake_server
    out = tmp_path / "measured"
    args = parse(
        [
            "--engine",
            url,
            "--model",
            "fake-model",
            "--granularity-prefill",
            "3",
            "--granularity-decode",
            "3",
            "--granularity-concurrency",
            "2",
            "--max-context-length",
            "300",
            "--decode-osl",
            "6",
            "--gpu",
            "h100_sxm",
            "-o",
            str(out),
        ]
    )
    assert run_sweep(args) == 0
    profile = load_profile(out)
    assert profile.max_kv_tokens == 640  # 40 blocks x 16 from /metrics
    pre = profile.prefill.data
    assert list(pre.isl) == [100, 173, 299]
    expected_ttft = 2 + 0.005 * pre.isl
    # the server cannot answer sooner than its model says; how much later depends on how
    # busy this machine is, so the upper bound only rules out a wrong unit or a stuck stream
    assert np.all(pre.ttft_ms >= expected_ttft) and np.all(pre.ttft_ms < expected_ttft + 2000)
    dec = profile.decode.data
    first = dec.context_length == dec.context_length.min()
    itl = dec.itl_ms[first][np.argsort(dec.kv_usage[first])]
    # every token gap is at least the fake engine's 1 ms + 1 ms per request in flight; the
    # growth with concurrency is a few ms, below this shared machine's timing noise
    assert np.all(itl >= 2.0) and np.all(np.isfinite(itl))
    manifest = load_manifest(out / "profile.yaml")
    assert (manifest.source, manifest.model, manifest.gpu) == ("measured", "fake-model", "h100_sxm")
    # Exact ISLs as token ids, the OSL pinned, and no two prompts sharing a first block.
    prefill_prompts = [
        p for p, b in zip(engine.prompts, engine.bodies, strict=True) if b["max_tokens"] == 1
    ]
    assert sorted({len(p) for p in prefill_prompts}) == [100, 173, 299]
    assert all(b["ignore_eos"] and b["stream"] for b in engine.bodies)
    assert len({tuple(p[:16]) for p in engine.prompts}) == len(engine.prompts)


def test_endpoint_errors_are_clear(fake_server):
    url, _engine = fake_server
    from disagg_planner.simulator.profiling import HttpEndpoint

    ep = HttpEndpoint(url, model="other-model", max_kv_tokens=1000)
    with pytest.raises(ProfilingError, match="answered HTTP 404"):
        ep.stream(10, 2)
    with pytest.raises(ProfilingError, match="cannot reach"):
        HttpEndpoint("http://127.0.0.1:9", model="m")
    with pytest.raises(ProfilingError, match="expected http://HOST:PORT"):
        HttpEndpoint("ftp://x", model="m", max_kv_tokens=10)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-o", "x"], "--engine is required"),
        (["--engine", "sim:llama-3.1-8b@h200"], "-o/--output DIR is required"),
        (["--engine", "http://127.0.0.1:1", "-o", "x"], "--model NAME is required"),
        (["--engine", "vllm://x", "-o", "x"], "expected sim:MODEL@GPU"),
    ],
)
def test_cli_usage_errors(argv, message):
    with pytest.raises(SpecError, match=message):
        run_sweep(parse(argv))


def test_simulator_input_errors_map_to_spec_errors(tmp_path):
    args = parse(["--engine", "sim:gpt-9@h200", "-o", str(tmp_path / "x")])
    with pytest.raises(Exception) as info:
        run_sweep(args)
    assert classify(info.value) is SpecError
    assert "unknown model 'gpt-9'" in str(info.value)


def test_sweep_config_validation():
    with pytest.raises(ProfilingError, match="granularity must be >= 2"):
        SweepConfig(granularity_prefill=1)
    engine = SimulatedEngine("sim:llama-3.1-8b-fp8@h200_sxm:tp1")
    with pytest.raises(ProfilingError, match="max context 200 must exceed"):
        sweep(engine, SweepConfig(max_context_length=200))
    with pytest.raises(ProfilingError, match=r"max_kv_usage=1\.5"):
        SweepConfig(max_kv_usage=1.5)
