"""``planner profile --engine ENGINE -o DIR``: sweep an engine and write a profile.

``ENGINE`` is a simulated engine spec (``sim:MODEL@GPU[:tpN][:dpN][:epN][:key=value]``,
see ``disagg_planner.simulator.engine_spec``) or the URL of a real OpenAI-compatible endpoint
(``http://HOST:PORT``, which also needs ``--model``). The sweep follows Dynamo's profiler
(``disagg_planner.simulator.profiling``) and writes Dynamo's NPZ layout plus a ``profile.yaml``
manifest (``source: modelled`` or ``measured``).

The ``profile`` command's parser adds these options with :func:`add_sweep_arguments` and
calls :func:`run_sweep` when ``--engine`` is given without an action.

Progress: one line up front (how many points at most), then one progress line on stderr
(:class:`SweepProgress`), redrawn in place on a terminal and written as a plain line every
``PLAIN_EVERY_S`` of wall time otherwise, as a replay's progress is; each point's own line
(hundreds) is a DEBUG log line (``--log-level DEBUG``, which shows them instead of the bar).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from disagg_planner.errors import SpecError
from disagg_planner.replay.progress import BAR_WIDTH, PLAIN_EVERY_S, REDRAW_S

log = logging.getLogger(__name__)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the sweep options (``--engine``, ``-o`` and the sweep's knobs) to ``parser``."""
    group = parser.add_argument_group(
        "profiling sweep",
        "Sweep an engine like Dynamo's profiler and write a profile: "
        "planner profile --engine sim:llama-3.1-8b-fp8@h200_sxm:tp1 -o DIR",
    )
    group.add_argument(
        "--engine",
        metavar="SPEC|URL",
        help="sim:MODEL@GPU[:tpN][:dpN][:epN][:key=value] for the simulator, or "
        "http://HOST:PORT for a running OpenAI-compatible endpoint (with --model).",
    )
    group.add_argument(
        "-o", "--output", dest="sweep_output", metavar="DIR", help="Profile directory to write."
    )
    group.add_argument(
        "--granularity-prefill",
        type=_positive_int,
        default=24,
        metavar="N",
        help="Number of ISLs in the prefill sweep, spaced geometrically (default 24).",
    )
    group.add_argument(
        "--granularity-decode",
        type=_positive_int,
        default=16,
        metavar="N",
        help="Number of context lengths in the decode sweep, spaced geometrically from "
        "--min-context to the engine's context (default %(default)s).",
    )
    group.add_argument(
        "--granularity-concurrency",
        type=_positive_int,
        default=20,
        metavar="N",
        help="Number of concurrencies per decode context, spaced geometrically from 1 to "
        "what fills --max-kv-usage of the KV cache (default %(default)s).",
    )
    group.add_argument(
        "--min-context",
        type=_positive_int,
        default=256,
        metavar="TOKENS",
        help="Shortest decode context length swept (default 256).",
    )
    group.add_argument(
        "--max-kv-usage",
        type=float,
        default=0.95,
        metavar="FRACTION",
        help="KV-cache usage the decode sweep reaches at every context (default 0.95), "
        "unless the engine's max_num_seqs stops it first (reported).",
    )
    group.add_argument(
        "--max-context-length",
        type=_positive_int,
        metavar="TOKENS",
        help="Largest ISL swept (default: the engine's context; 16384 for an endpoint).",
    )
    group.add_argument(
        "--decode-osl",
        type=_positive_int,
        metavar="TOKENS",
        help="Longest output of the decode sweep's requests (default: a tenth of the "
        "context at each context swept).",
    )
    group.add_argument("--model", metavar="NAME", help="Model name to request (endpoint only).")
    group.add_argument(
        "--gpus",
        type=_positive_int,
        default=1,
        metavar="N",
        help="GPUs the endpoint's engine uses (endpoint only; default 1).",
    )
    group.add_argument(
        "--tp", type=_positive_int, default=1, metavar="N", help="Endpoint's TP (manifest)."
    )
    group.add_argument(
        "--dp",
        type=_positive_int,
        default=1,
        metavar="N",
        help="Endpoint's data-parallel ranks (default 1).",
    )
    group.add_argument(
        "--max-kv-tokens",
        type=_positive_int,
        metavar="TOKENS",
        help="Endpoint's KV-cache capacity (default: read vllm:cache_config_info from /metrics).",
    )
    group.add_argument(
        "--gpu", default="unknown", metavar="NAME", help="GPU type for the manifest (endpoint)."
    )
    group.add_argument(
        "--backend", default="vllm", metavar="NAME", help="Backend for the manifest (endpoint)."
    )
    group.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="Per-request timeout against an endpoint (default 600).",
    )


class SweepProgress:
    """The sweep's progress callback: counts the points it reports (each point swept, or
    left out, is one message) and draws one line on ``stream`` (module doc).

    ``expected`` is the most points the sweep can report (the granularities multiplied out;
    KV-cache and ``max_num_seqs`` limits cut the decode rows short, so it is an upper bound).
    """

    def __init__(
        self,
        expected: int,
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        # with every point logged, the bar would only interleave with the lines
        self.enabled = not log.isEnabledFor(logging.DEBUG)
        self.expected = max(1, expected)
        self.clock = clock
        self.started = clock()
        self.points = 0
        self.last = ""
        self._drawn_at = self.started

    def start(self, engine: str) -> None:
        if self.enabled:
            self._write(f"profile sweep of {engine}: at most {self.expected} points", end=True)

    def __call__(self, message: str) -> None:
        log.debug(message)
        self.points += 1
        self.last = message
        now = self.clock()
        due = REDRAW_S if self.terminal else PLAIN_EVERY_S
        if self.enabled and now - self._drawn_at >= due:
            self._drawn_at = now
            self._write(self.line(now), end=not self.terminal)

    def line(self, now: float) -> str:
        done = min(1.0, self.points / self.expected)
        bar = "#" * int(done * BAR_WIDTH)
        return (
            f"profile sweep: [{bar:<{BAR_WIDTH}}] {self.points} of at most {self.expected} "
            f"points, {now - self.started:.0f} s; last: {self.last}"
        )

    def close(self) -> None:
        """The last line: how long it took (what it wrote is said once written)."""
        if self.enabled:
            self._write(f"profile sweep: done in {self.clock() - self.started:.0f} s", end=True)

    def _write(self, text: str, *, end: bool) -> None:
        prefix = "\r\x1b[K" if self.terminal else ""
        self.stream.write(prefix + text + ("\n" if end else ""))
        self.stream.flush()


def run_sweep(args: argparse.Namespace) -> int:
    """Run the sweep the parsed options describe; returns the exit status."""
    from disagg_planner.simulator import profiling  # numpy and the simulator load only for a sweep

    engine = getattr(args, "engine", None)
    output = getattr(args, "sweep_output", None)
    if not engine:
        raise SpecError("--engine is required for a profiling sweep")
    if not output:
        raise SpecError("-o/--output DIR is required with --engine")
    config = profiling.SweepConfig(
        granularity_prefill=args.granularity_prefill,
        granularity_decode=args.granularity_decode,
        granularity_concurrency=args.granularity_concurrency,
        min_context=args.min_context,
        max_kv_usage=args.max_kv_usage,
        max_context_length=args.max_context_length,
        decode_osl=args.decode_osl,
    )
    tool = "planner profile " + " ".join(
        shlex.quote(a) for a in _tool_args(args, engine=engine, output=output)
    )
    if engine.startswith(("http://", "https://")):
        if not args.model:
            raise SpecError("--model NAME is required with an http:// endpoint")
        target = profiling.HttpEndpoint(
            engine,
            model=args.model,
            gpus=args.gpus,
            dp=args.dp,
            max_kv_tokens=args.max_kv_tokens,
            max_context=args.max_context_length or profiling.DEFAULT_MAX_CONTEXT,
            timeout_s=args.request_timeout,
        )
        manifest = profiling.endpoint_manifest(
            target, gpu=args.gpu, backend=args.backend, tool=tool, tp=args.tp, dp=args.dp
        )
        sweep_target: profiling.SweepTarget = target
    elif engine.lower().startswith(("sim:", "aic:")):
        sim = profiling.SimulatedEngine(engine)
        manifest = profiling.simulated_manifest(sim.spec, tool=tool)
        sweep_target = sim
    else:
        raise SpecError(
            f"--engine {engine!r}: expected sim:MODEL@GPU[:tpN]..., aic:MODEL@GPU[:BACKEND]... "
            "or http://HOST:PORT"
        )
    progress = SweepProgress(
        config.granularity_prefill + config.granularity_decode * config.granularity_concurrency
    )
    progress.start(engine)
    try:
        result = profiling.run_sweep(sweep_target, config, progress=progress)
    finally:
        progress.close()
    path = result.write(Path(output), manifest=manifest)
    for cut in result.details.get("cut_by_max_num_seqs", []):
        print(
            f"warning: max_num_seqs cuts the decode sweep short of KV usage "
            f"{config.max_kv_usage:g}: {cut}",
            file=sys.stderr,
        )
    print(
        f"wrote {path}: {len(result.prefill_isl)} prefill and {len(result.decode_itl_ms)} "
        f"decode points, max_kv_tokens {result.max_kv_tokens}",
        file=sys.stdout,
    )
    return 0


def _tool_args(args: argparse.Namespace, *, engine: str, output: str) -> list[str]:
    out = ["--engine", engine]
    if engine.startswith(("http://", "https://")):
        out += ["--model", str(args.model)]
    out += [
        "--granularity-prefill",
        str(args.granularity_prefill),
        "--granularity-decode",
        str(args.granularity_decode),
        "--granularity-concurrency",
        str(args.granularity_concurrency),
    ]
    if args.min_context != 256:
        out += ["--min-context", str(args.min_context)]
    if args.max_kv_usage != 0.95:
        out += ["--max-kv-usage", f"{args.max_kv_usage:g}"]
    if args.max_context_length:
        out += ["--max-context-length", str(args.max_context_length)]
    if args.decode_osl is not None:
        out += ["--decode-osl", str(args.decode_osl)]
    return [*out, "-o", output]
