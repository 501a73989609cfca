"""The workload ``planner replay`` runs when given none, generated from measured facts, and
the settings that default run uses.

Third-party traces stay out of the package, so the default cannot replay the Azure 2023
conversation trace itself. ``default_workload.json`` (next to this module) holds facts
measured from it instead: the request count of each minute of the span the default replays,
and the joint distribution of prompt (ISL) and output (OSL) lengths. ISL and OSL are not
independent there (the OSL mean per ISL quartile is about 114, 194, 408 and 129 tokens;
independent marginals would give about 211 in each), so the lengths are kept as ISL bins of
equal request share (by ISL rank), and per bin the quantiles of its ISL and of its OSL. The
mix changes over the span (the mean ISL of a minute ranges from 778 to 1,451 tokens), and
the planner and the oracle size replicas by it, so each minute's count is kept per bin.

:func:`requests` generates from the facts: each minute gets exactly its measured count of
arrivals of each bin, uniform within the minute (a Poisson process conditioned on the
count), each with an ISL and an OSL drawn from its bin's quantiles (inverse CDF with linear
interpolation). Deterministic given ``seed``.

Regenerate the facts from the trace (https://github.com/Azure/AzurePublicDataset,
``data/AzureLLMInferenceTrace_conv.csv``)::

    python -m disagg_planner.replay.default_workload --from-trace FILE
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from disagg_planner.config.loader import LoadedConfig
from disagg_planner.config.schema import PlannerConfig
from disagg_planner.predictors.traces import TraceRequest, read_trace

log = logging.getLogger(__name__)

FACTS_FILE = "default_workload.json"
SOURCE = {
    "dataset": "Azure LLM inference trace 2023, conversation service",
    "url": "https://github.com/Azure/AzurePublicDataset",
    "file": "data/AzureLLMInferenceTrace_conv.csv",
    "sha256": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
    "license": "CC-BY 4.0",
    "attribution": 'Patel et al., "Splitwise: Efficient generative LLM inference using phase '
    'splitting", ISCA 2024',
}
# The default replays the trace's 58 whole minutes: its load rises by half from minute 20 to
# minute 36 and falls back below its start by minute 48, which is what autoscaling is for.
MINUTES = 58
ISL_BINS = 20
QUANTILES = 51  # per bin, at 0, 2, ..., 100 %: 0.1 % of the requests between two points
# What ``planner replay`` runs with no arguments (cli/replay_cmd): the generated hour
# compressed 2x (arrivals over 1,740 s) at 4 times its load, on the bundled H200 profile,
# under the planner with its load loop on (every 5 s, so the replicas panel shows hundreds
# of ticks, not the ten of a 180 s throughput loop alone), beside an HPA and the cheapest
# static deployment that meets the SLO target on this traffic (``best-static``, which the
# references search for anyway: 3 prefill and 1 decode; 2 prefill cannot serve the peak).
# The simulation's cost grows with the requests, hardly with the simulated span (4x instead
# of 2x saved 8 % of the planner's CPU time) and 120 s startups follow a faster ramp worse.
DEFAULT_PROFILE = "h200_sxm/vllm/llama-3.1-8b-fp8/tp1"
DEFAULT_SPEEDUP = 2.0
DEFAULT_SCALE_LOAD = 4.0
DEFAULT_DURATION_S: float | None = None  # the whole generated hour
DEFAULT_POLICIES = ("planner", "hpa", "best-static")
# Settings the default run changes where the user set nothing (config file, env or flag).
DEFAULT_SETTINGS: dict[str, object] = {"enable_load_scaling": True}
# Any replay: a simulated cluster has no GPU budget unless given one.
REPLAY_SETTINGS: dict[str, object] = {"max_gpu_budget": -1}
# The generator's own stream: ``scale_load`` seeds ``random.Random(seed)`` too, and the same
# sequence driving arrivals and clone jitter would correlate them.
_SALT = "default-workload:"


@dataclass(frozen=True)
class LengthBin:
    isl_quantiles: tuple[float, ...]
    osl_quantiles: tuple[float, ...]


@dataclass(frozen=True)
class WorkloadFacts:
    by_minute: tuple[tuple[int, ...], ...]  # [minute][bin]: requests
    bins: tuple[LengthBin, ...]

    @classmethod
    def from_json(cls, data: dict) -> WorkloadFacts:
        by_minute = tuple(tuple(int(n) for n in row) for row in data["requests_by_minute_and_bin"])
        # The per-minute counts are stated for readers; they must be what generates.
        if [sum(row) for row in by_minute] != data["requests_per_minute"]:
            raise ValueError("requests_per_minute are not the row sums of the per-bin counts")
        bins = tuple(
            LengthBin(tuple(b["isl_quantiles"]), tuple(b["osl_quantiles"]))
            for b in data["lengths"]["bins"]
        )
        return cls(by_minute, bins)


@cache
def packaged_facts() -> WorkloadFacts:
    text = resources.files(__package__).joinpath(FACTS_FILE).read_text(encoding="utf-8")
    return WorkloadFacts.from_json(json.loads(text))


def requests(seed: int = 0, facts: WorkloadFacts | None = None) -> Iterator[TraceRequest]:
    """The generated requests, time-sorted, arrivals from 0 to ``60 * minutes`` seconds."""
    facts = facts or packaged_facts()
    rng = random.Random(_SALT + str(seed))
    for minute, counts in enumerate(facts.by_minute):
        chosen = [facts.bins[k] for k, n in enumerate(counts) for _ in range(n)]
        rng.shuffle(chosen)
        offsets = sorted(rng.uniform(0.0, 60.0) for _ in chosen)
        for offset, lengths in zip(offsets, chosen, strict=True):
            yield TraceRequest(
                arrival_s=60.0 * minute + offset,
                input_length=_draw(lengths.isl_quantiles, rng),
                output_length=_draw(lengths.osl_quantiles, rng),
            )


def _draw(quantiles: Sequence[float], rng: random.Random) -> int:
    """Inverse CDF through equally spaced quantiles, interpolated linearly; at least 1."""
    x = rng.random() * (len(quantiles) - 1)
    k = min(int(x), len(quantiles) - 2)
    value = quantiles[k] + (quantiles[k + 1] - quantiles[k]) * (x - k)
    return max(1, round(value))


def replay_config(loaded: LoadedConfig, *, default_run: bool) -> PlannerConfig:
    """The config replay runs: the loaded one, with :data:`REPLAY_SETTINGS` (and, for the
    default run, :data:`DEFAULT_SETTINGS`) applied to every field the user left at its
    default, each change logged, so that what replay runs is what it says."""
    changes = dict(REPLAY_SETTINGS) | (dict(DEFAULT_SETTINGS) if default_run else {})
    update = {}
    for name, value in changes.items():
        if loaded.sources.get(name, "default") != "default":
            continue
        before = getattr(loaded.config, name)
        if before != value:
            update[name] = value
            log.info(
                "replay: %s = %s (the default is %s; %s)",
                name,
                json.dumps(value),
                json.dumps(before),
                _WHY.get(name, "set it to keep the default"),
            )
    return loaded.config.model_copy(update=update) if update else loaded.config


_WHY = {
    "max_gpu_budget": "a simulated cluster has no GPU budget unless given one: "
    "--max-gpu-budget N or the config sets one",
    "enable_load_scaling": "the default run shows the load loop's decisions; "
    "--no-enable-load-scaling for the throughput loop alone",
}


def measure(trace: Path, *, minutes: int = MINUTES) -> dict:
    """The facts file's content, measured from the first ``minutes`` of ``trace``."""
    digest = hashlib.sha256(trace.read_bytes()).hexdigest()
    if digest != SOURCE["sha256"]:
        # The source named in the file must be the one measured.
        raise SystemExit(
            f"{trace}: sha256 {digest} is not that of {SOURCE['url']} {SOURCE['file']} "
            f"({SOURCE['sha256']})"
        )
    span_s = 60.0 * minutes
    kept = [r for r in read_trace(trace, trace_format="azure") if r.arrival_s < span_s]
    isl = np.array([r.input_length for r in kept])
    osl = np.array([r.output_length for r in kept])
    minute = np.array([int(r.arrival_s // 60) for r in kept])
    probabilities = np.linspace(0.0, 1.0, QUANTILES)
    # Bins by ISL rank, not value: many requests share one ISL, and equal shares keep every
    # bin's quantiles equally well sampled.
    groups = np.array_split(np.argsort(isl, kind="stable"), ISL_BINS)
    by_minute = np.zeros((minutes, ISL_BINS), dtype=int)
    for k, group in enumerate(groups):
        by_minute[:, k] = np.bincount(minute[group], minlength=minutes)
    return {
        "what": f"Facts measured from the first {minutes} minutes of the trace below, from "
        "which disagg_planner.replay.default_workload generates the default workload of "
        "planner replay (its module doc says how). requests_by_minute_and_bin[m][k]: the "
        "requests of minute m (from the first arrival) in ISL bin k of lengths.bins; "
        "requests_per_minute: its row sums.",
        "source": SOURCE,
        "regenerate": "python -m disagg_planner.replay.default_workload --from-trace "
        "AzureLLMInferenceTrace_conv.csv",
        "requests_per_minute": [int(n) for n in by_minute.sum(axis=1)],
        "requests_by_minute_and_bin": by_minute.tolist(),
        "lengths": {
            "method": f"{ISL_BINS} bins of equal request share by ISL rank; per bin the ISL "
            f"and OSL quantiles at {QUANTILES} equally spaced probabilities from 0 to 1 "
            "(numpy linear), in tokens",
            "bins": [
                {
                    "isl_quantiles": _rounded(np.quantile(isl[group], probabilities)),
                    "osl_quantiles": _rounded(np.quantile(osl[group], probabilities)),
                }
                for group in groups
            ],
        },
    }


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(v), 1) for v in values]


def dumps(facts: dict) -> str:
    """JSON with each number list on one line, so the file reads (and diffs) by field."""
    text = json.dumps(facts, indent=2)
    return re.sub(r"\[\s+([-\d.,\s]+?)\s+\]", lambda m: "[" + " ".join(m[1].split()) + "]", text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m disagg_planner.replay.default_workload",
        description="Measure the default replay workload's facts from the Azure 2023 "
        "conversation trace and write them.",
    )
    parser.add_argument(
        "--from-trace",
        type=Path,
        required=True,
        metavar="FILE",
        help=f"AzureLLMInferenceTrace_conv.csv ({SOURCE['url']}, {SOURCE['file']})",
    )
    parser.add_argument("--minutes", type=int, default=MINUTES, help="span measured")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path(__file__).with_name(FACTS_FILE),
        help="where to write (default: the packaged file)",
    )
    args = parser.parse_args(argv)
    args.output.write_text(dumps(measure(args.from_trace, minutes=args.minutes)) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
