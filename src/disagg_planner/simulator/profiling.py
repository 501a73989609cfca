"""Profiling sweeps in the manner of Dynamo's pre-deployment profiler, against the simulated
engine or a real OpenAI-compatible endpoint, dense enough to cover the SLA range.

- **Prefill**: ``granularity_prefill`` ISLs spaced geometrically from ``min_isl`` to the
  engine's context (the model's, 128k for Llama 3.1), so short prompts, where most traffic
  and the TTFT targets are, get as many samples as long ones; at each, requests with one
  output token are sent one at a time (one per data-parallel rank at once), giving TTFT and
  ``thpt_per_gpu = ISL / TTFT / GPUs-per-rank``.
- **Decode**: ``granularity_decode`` context lengths spaced geometrically from
  ``min_context`` (256) to the engine's context; at each, ``granularity_concurrency``
  concurrencies spaced geometrically from 1 to what keeps the KV cache at
  ``max_kv_usage`` (0.95) -- or less where ``max_num_seqs`` stops it, which the sweep
  reports. A closed loop keeps that many requests in flight; each point records the mean ITL
  of the requests that ran wholly in the steady state, ``context_length = ISL + OSL/2``,
  ``kv_usage = concurrency * context_length / max_kv_tokens`` and
  ``thpt_per_gpu = concurrency / ITL / GPUs``. The OSL is a tenth of the context (or
  ``decode_osl`` if shorter): a request's KV grows to ``ISL + OSL`` while its mean context is
  ``ISL + OSL/2``, so only an OSL short against the context lets the mean KV usage reach 0.95
  without preemption, and one proportional to the context keeps the share of a request's
  life spent in prefill and KV transfer (out of the decode batch) about the same at 256 and
  at 128k tokens.

The result is written in Dynamo's NPZ layout with ``disagg_planner.profiles.write_profile`` plus a
``profile.yaml`` manifest (``source: modelled`` for the simulator, ``measured`` for an
endpoint).
"""

from __future__ import annotations

import datetime as _dt
import http.client
import json
import math
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from disagg_planner.predictors.traces import TraceRequest
from disagg_planner.profiles import EngineShape, ProfileManifest, write_profile
from disagg_planner.signals.fpm import ForwardPassMetrics
from disagg_planner.simulator.cluster import Cluster
from disagg_planner.simulator.engine_spec import EngineSpec, coerce
from disagg_planner.simulator.engines import engine_for
from disagg_planner.simulator.errors import ProfilingError
from disagg_planner.simulator.request import RequestRecord

DEFAULT_GRANULARITY_PREFILL = 24
DEFAULT_GRANULARITY_DECODE = 16
DEFAULT_GRANULARITY_CONCURRENCY = 20
DEFAULT_MIN_CONTEXT = 256
DEFAULT_MAX_KV_USAGE = 0.95
# An endpoint does not say its context; this is what is assumed without --max-context-length.
DEFAULT_MAX_CONTEXT = 16384
# The decode OSL is at most this share of the context (see the module doc).
_OSL_SHARE_OF_CONTEXT = 0.1


@dataclass(frozen=True)
class SweepConfig:
    """What to sweep. ``max_context_length`` None: the engine's context."""

    granularity_prefill: int = DEFAULT_GRANULARITY_PREFILL
    granularity_decode: int = DEFAULT_GRANULARITY_DECODE
    granularity_concurrency: int = DEFAULT_GRANULARITY_CONCURRENCY
    max_context_length: int | None = None
    min_isl: int = 100
    min_context: int = DEFAULT_MIN_CONTEXT
    max_kv_usage: float = DEFAULT_MAX_KV_USAGE
    decode_osl: int | None = None
    decode_rounds: float = 2.0  # measured requests per concurrency slot, after one warm-up wave

    def __post_init__(self) -> None:
        if min(self.granularity_prefill, self.granularity_decode, self.granularity_concurrency) < 2:
            raise ProfilingError(
                f"granularity must be >= 2 (prefill {self.granularity_prefill}, "
                f"decode {self.granularity_decode}, concurrency {self.granularity_concurrency})"
            )
        if self.min_isl < 1 or (self.decode_osl or 2) < 2 or self.min_context < 4:
            raise ProfilingError(
                f"min_isl={self.min_isl} must be >= 1, decode_osl={self.decode_osl} >= 2 and "
                f"min_context={self.min_context} >= 4"
            )
        if not 0.0 < self.max_kv_usage <= 1.0:
            raise ProfilingError(f"max_kv_usage={self.max_kv_usage} must be in (0, 1]")
        if self.decode_rounds <= 0:
            raise ProfilingError("decode_rounds must be > 0")

    def decode_osl_at(self, context: float) -> int:
        """Output length of the decode requests at ``context`` (see the module doc)."""
        share = round(_OSL_SHARE_OF_CONTEXT * context)
        return max(2, share if self.decode_osl is None else min(self.decode_osl, share))


@dataclass(frozen=True)
class SweepResult:
    """The measured points, in the units of Dynamo's NPZ files."""

    prefill_isl: list[float]
    prefill_ttft_ms: list[float]
    prefill_thpt_per_gpu: list[float]
    decode_kv_usage: list[float]
    decode_context_length: list[float]
    decode_itl_ms: list[float]
    decode_thpt_per_gpu: list[float]
    max_kv_tokens: int
    details: dict[str, Any] = field(default_factory=dict)

    def write(self, directory: str | Path, *, manifest: ProfileManifest | None) -> Path:
        return write_profile(
            directory,
            prefill_isl=self.prefill_isl,
            prefill_ttft_ms=self.prefill_ttft_ms,
            prefill_thpt_per_gpu=self.prefill_thpt_per_gpu,
            decode_kv_usage=self.decode_kv_usage,
            decode_context_length=self.decode_context_length,
            decode_itl_ms=self.decode_itl_ms,
            decode_thpt_per_gpu=self.decode_thpt_per_gpu,
            max_kv_tokens=self.max_kv_tokens,
            manifest=manifest,
        )


@dataclass(frozen=True)
class DecodeMeasurement:
    """One decode point: the mean ITL and how many requests were decoding on average.

    ``running`` is below the closed loop's concurrency by the requests between two decode
    phases (in prefill or KV transfer); a target that cannot see it reports the concurrency.
    """

    itl_ms: float
    running: float
    # Requests preempted (KV recomputed) while it was measured: such a point times recompute
    # passes, not a steady batch, and the sweep leaves it out. 0 where a target cannot see it.
    preemptions: int = 0


class SweepTarget(Protocol):
    """An engine to profile."""

    gpus: int  # GPUs of one engine
    dp: int  # data-parallel ranks (requests sent at once for a prefill point)
    max_kv_tokens: int  # whole engine
    max_context: int
    max_num_seqs: int | None  # whole engine

    def prefill_ttft_ms(self, isl: int, *, concurrent: int) -> float:
        """Mean TTFT of ``concurrent`` simultaneous requests of ``isl`` tokens, one output."""

    def decode_point(
        self, isl: int, osl: int, *, concurrency: int, measured: int
    ) -> DecodeMeasurement:
        """Mean ITL while ``concurrency`` requests stay in flight (closed loop)."""


def _geometric_grid(lo: int, hi: int, n: int) -> list[int]:
    """About ``n`` distinct integers from ``lo`` to ``hi`` (both included), evenly spaced on a
    log scale; where rounding would repeat an integer the next one is taken instead."""
    if hi <= lo:
        return [lo]
    out: list[int] = []
    for x in np.geomspace(lo, hi, n):
        v = max(round(float(x)), out[-1] + 1 if out else lo)
        if v <= hi:
            out.append(v)
    if out[-1] != hi:
        out.append(hi)
    return out


def run_sweep(
    target: SweepTarget,
    config: SweepConfig,
    *,
    progress: Callable[[str], None] | None = None,
) -> SweepResult:
    """Sweep ``target`` (see the module doc)."""
    say = progress or (lambda _msg: None)
    max_ctx = min(config.max_context_length or target.max_context, target.max_context)
    if max_ctx <= max(config.min_isl, config.min_context):
        raise ProfilingError(
            f"max context {max_ctx} must exceed min_isl {config.min_isl} and min_context "
            f"{config.min_context}"
        )
    per_rank_gpus = target.gpus / target.dp
    p_isl, p_ttft, p_thpt = [], [], []
    for isl in _geometric_grid(config.min_isl, max_ctx - 1, config.granularity_prefill):
        ttft = target.prefill_ttft_ms(isl, concurrent=target.dp)
        p_isl.append(float(isl))
        p_ttft.append(ttft)
        p_thpt.append(isl / (ttft / 1000.0) / per_rank_gpus)
        say(f"prefill ISL {isl}: TTFT {ttft:.1f} ms")
    d_kv, d_ctx, d_itl, d_thpt = [], [], [], []
    cut_by_max_num_seqs: list[str] = []
    top_context = max_ctx - config.decode_osl_at(max_ctx) // 2
    for context_target in _geometric_grid(
        config.min_context, top_context, config.granularity_decode
    ):
        osl = config.decode_osl_at(context_target)
        isl = max(1, min(context_target - osl // 2, max_ctx - osl))
        context = isl + osl / 2.0
        # At most max_kv_usage of the cache by mean context, and never more than the cache
        # holds at the requests' final length (no preemption).
        cap = min(
            int(config.max_kv_usage * target.max_kv_tokens // context),
            int(target.max_kv_tokens // (isl + osl)),
        )
        if target.max_num_seqs is not None and target.max_num_seqs < cap:
            cap = target.max_num_seqs
            cut_by_max_num_seqs.append(
                f"context {context:g} stops at KV usage {cap * context / target.max_kv_tokens:.2f}"
            )
        if cap < 1:
            continue
        for conc in _geometric_grid(1, cap, config.granularity_concurrency):
            measured = max(2, math.ceil(conc * config.decode_rounds))
            point = target.decode_point(isl, osl, concurrency=conc, measured=measured)
            if point.preemptions:
                # The cap keeps the whole cache from overflowing, not each data-parallel
                # rank: a rank holding a few more requests than its share preempts, and the
                # point would time recompute (DeepSeek-V3 DP16 at the top of a row: +5%).
                say(
                    f"decode ISL {isl} OSL {osl} concurrency {conc}: left out, "
                    f"{point.preemptions} preemptions"
                )
                continue
            d_kv.append(min(1.0, point.running * context / target.max_kv_tokens))
            d_ctx.append(context)
            d_itl.append(point.itl_ms)
            d_thpt.append(point.running / (point.itl_ms / 1000.0) / target.gpus)
            say(
                f"decode ISL {isl} OSL {osl} concurrency {conc} ({point.running:.1f} "
                f"decoding): ITL {point.itl_ms:.2f} ms"
            )
    if cut_by_max_num_seqs:
        say(
            f"max_num_seqs {target.max_num_seqs} cuts the decode sweep short of KV usage "
            f"{config.max_kv_usage:g}: " + "; ".join(cut_by_max_num_seqs)
        )
    if len(d_kv) < 3:
        raise ProfilingError(
            f"only {len(d_kv)} decode points fit the KV cache ({target.max_kv_tokens} tokens); "
            "lower --max-context-length"
        )
    return SweepResult(
        prefill_isl=p_isl,
        prefill_ttft_ms=p_ttft,
        prefill_thpt_per_gpu=p_thpt,
        decode_kv_usage=d_kv,
        decode_context_length=d_ctx,
        decode_itl_ms=d_itl,
        decode_thpt_per_gpu=d_thpt,
        max_kv_tokens=int(target.max_kv_tokens),
        details={
            "max_context_length": max_ctx,
            "decode_osl": config.decode_osl,
            "cut_by_max_num_seqs": cut_by_max_num_seqs,
        },
    )


# --- the simulated engine ----------------------------------------------------------------------


class SimulatedEngine:
    """A :class:`SweepTarget` running the cluster simulator: prefill on one aggregated
    replica, decode on one decode replica fed by enough prefill replicas that prefill never
    limits the loop (as a profiler measures a decode worker)."""

    def __init__(self, spec: EngineSpec | str, *, seed: int = 0) -> None:
        self.spec = coerce(spec)
        self.model = engine_for(self.spec)
        self.gpus = self.spec.gpus
        self.dp = self.spec.dp
        self.max_kv_tokens = self.model.max_kv_tokens * self.spec.dp
        self.max_context = self.model.max_model_len
        self.max_num_seqs: int | None = self.spec.max_num_seqs * self.spec.dp
        self.seed = seed

    def prefill_ttft_ms(self, isl: int, *, concurrent: int) -> float:
        # One request per data-parallel rank at once on an idle engine (round-robin routing
        # puts one on each rank); the simulator is deterministic, so one round suffices.
        cluster = Cluster(engines={"agg": self.spec}, mode="agg", replicas={"agg": 1})
        n = max(1, concurrent)
        cluster.submit(
            TraceRequest(arrival_s=0.0, input_length=isl, output_length=1) for _ in range(n)
        )
        cluster.run_until(math.inf)
        ttfts = [r.ttft_ms for r in cluster.records if r.ttft_ms is not None]
        if len(ttfts) != n:
            raise ProfilingError(f"simulated prefill at ISL {isl} produced no first token")
        return float(np.mean(ttfts))

    def decode_point(
        self, isl: int, osl: int, *, concurrency: int, measured: int
    ) -> DecodeMeasurement:
        # Enough prefill replicas to keep the decode engine at ``concurrency``.
        t_prefill = self.model.prefill_time_s(isl)
        t_decode = osl * self.model.decode_step_time_s(
            max(1, concurrency // self.dp), isl + osl / 2
        )
        prefill_replicas = max(1, math.ceil(2 * concurrency * t_prefill / max(t_decode, 1e-6)))
        refills: list[RequestRecord] = []
        preemptions = 0
        # (time, duration, decoding requests, rank) of every decode iteration.
        steps: list[tuple[float, float, int, int]] = []
        # A warm-up wave, the measured requests, then one more wave so that the measured ones
        # finish before the batch drains (requests ending in the drain run with a shrinking
        # batch and would read several percent fast).
        target = 2 * concurrency + measured
        issued = concurrency
        last_submit_s = 0.0

        def on_record(rec: RequestRecord) -> None:
            nonlocal issued, last_submit_s, preemptions
            preemptions += rec.preemptions
            if rec.arrival_s > 0.0 and rec.osl == osl:
                refills.append(rec)
            if issued < target:
                issued += 1
                last_submit_s = cluster.now
                cluster.submit(
                    [TraceRequest(arrival_s=cluster.now, input_length=isl, output_length=osl)]
                )

        def on_fpm(fpm: ForwardPassMetrics) -> None:
            if fpm.worker_id.startswith("decode") and fpm.wall_time > 0:
                # Every row of a decode worker's step makes a token: the decoding requests
                # and the arrivals whose transferred KV lacks only the last prompt token
                # (recomputed, sampled in the same step). Counting the decoders alone paired
                # a step's time with a batch smaller than the one it ran: at short outputs,
                # where an arrival joins every few steps, the profile read 4-5% slow.
                sched = fpm.scheduled_requests
                steps.append(
                    (
                        cluster.now,
                        fpm.wall_time,
                        sched.num_decode_requests + sched.num_prefill_requests,
                        fpm.dp_rank,
                    )
                )

        cluster = Cluster(
            engines={"prefill": self.spec, "decode": self.spec},
            replicas={"prefill": prefill_replicas, "decode": 1},
            on_record=on_record,
            on_fpm=on_fpm,
            seed=self.seed,
        )
        # The first wave has staggered lengths so that completions (and refills) spread out
        # as in a steady state instead of finishing in lockstep.
        cluster.submit(
            TraceRequest(
                arrival_s=0.0,
                input_length=isl,
                output_length=max(2, round(osl * (i + 1) / concurrency)),
            )
            for i in range(concurrency)
        )
        cluster.run_until(math.inf)
        if not refills:
            raise ProfilingError(f"simulated decode at ISL {isl} x {concurrency} gave no ITL")
        # The steady state: from the first refill's finish (the warm-up wave is mixed in by
        # then) to the last submission (after it the batch drains).
        start_s = refills[0].finish_s
        window = [(t, d, b, r) for t, d, b, r in steps if start_s < t <= last_submit_s and b > 0]
        if not window:
            window = [(t, d, b, r) for t, d, b, r in steps if b > 0]
        # The engine's own view: the mean step time and the mean batch of a step (requests
        # between prefill and decode are not in it), so that ``running / ITL`` is the tokens
        # per second the engine made and a step time linear in batch and KV is reproduced
        # exactly. The client-side ITL would add each request's KV-transfer wait to its
        # first decode step, several percent at short outputs.
        itl_ms = 1000.0 * sum(d for _t, d, _b, _r in window) / len(window)
        ranks = {r for _t, _d, _b, r in window}
        if len(ranks) == 1:
            return DecodeMeasurement(
                itl_ms=itl_ms,
                running=sum(b for _t, _d, b, _r in window) / len(window),
                preemptions=preemptions,
            )
        # Data-parallel ranks step on their own and, below one request per rank, not all of
        # them all the time: the engine's batch is each rank's mean batch weighted by the
        # share of the window that rank was stepping.
        span = max(t for t, *_ in window) - min(t - d for t, d, *_ in window)
        running = 0.0
        for rank in ranks:
            mine = [(d, b) for _t, d, b, r in window if r == rank]
            busy = min(1.0, sum(d for d, _b in mine) / span) if span > 0 else 1.0
            running += busy * sum(b for _d, b in mine) / len(mine)
        return DecodeMeasurement(itl_ms=itl_ms, running=running, preemptions=preemptions)


def simulated_manifest(spec: EngineSpec, *, tool: str) -> ProfileManifest:
    shape = EngineShape(
        tp=spec.tp,
        dp=spec.dp,
        ep=spec.ep,
        gpus_per_engine=spec.gpus,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_num_seqs=spec.max_num_seqs,
    )
    return ProfileManifest(
        model=spec.model.name,
        gpu=spec.gpu.name,
        backend=spec.backend,
        source="modelled",
        kv_block_size=spec.block_size,
        tool=tool,
        date=_dt.date.today().isoformat(),
        engine=shape,
        prefill_engine=shape,
        decode_engine=shape,
        extra={
            "engine_spec": str(spec),
            "model_notes": (
                "simulator roofline model calibrated in disagg_planner/simulator/CALIBRATION.md"
            ),
        },
    )


def parallelism_dirname(spec: EngineSpec) -> str:
    """``tp1``, ``tp4``, ``tp1-dp16-ep16``: the last folder of a bundled profile."""
    name = f"tp{spec.tp}"
    if spec.dp != 1:
        name += f"-dp{spec.dp}"
    if spec.ep != 1:
        name += f"-ep{spec.ep}"
    return name


def bundled_path(root: str | Path, spec: EngineSpec) -> Path:
    """``root/<gpu>/<backend>/<model>/<parallelism>`` for ``spec``."""
    return Path(root) / spec.gpu.name / spec.backend / spec.model.name / parallelism_dirname(spec)


# --- a real OpenAI-compatible endpoint ---------------------------------------------------------


@dataclass(frozen=True)
class StreamResult:
    ttft_s: float
    itl_s: float | None
    tokens: int


class HttpEndpoint:
    """A :class:`SweepTarget` that streams completions from an OpenAI-compatible server.

    Prompts are token-id arrays (``prompt: [ids]``), so the ISL is exact without a
    tokenizer; ``ignore_eos`` and ``min_tokens`` (vLLM/SGLang/Dynamo extensions) pin the OSL.
    Every prompt starts with distinct random ids so that no prefix-cache hit shortens a
    prefill. TTFT is the time to the first streamed token; ITL is
    ``(last token - first token) / (tokens - 1)``, tokens from the final usage chunk when the
    server sends one, else the number of streamed chunks.
    """

    def __init__(
        self,
        url: str,
        *,
        model: str,
        gpus: int = 1,
        dp: int = 1,
        max_kv_tokens: int | None = None,
        max_context: int = DEFAULT_MAX_CONTEXT,
        max_num_seqs: int | None = None,
        timeout_s: float = 600.0,
        seed: int = 0,
        vocab_range: tuple[int, int] = (1000, 30000),
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ProfilingError(f"endpoint {url!r}: expected http://HOST:PORT")
        self.url = url.rstrip("/")
        self._parsed = parsed
        self.model = model
        self.gpus = gpus
        self.dp = dp
        self.max_context = max_context
        self.max_num_seqs = max_num_seqs
        self.timeout_s = timeout_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._vocab = vocab_range
        self.max_kv_tokens = max_kv_tokens if max_kv_tokens is not None else self._kv_from_metrics()

    # -- HTTP -------------------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        p = self._parsed
        cls = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
        port = p.port or (443 if p.scheme == "https" else 80)
        return cls(p.hostname or "localhost", port, timeout=self.timeout_s)

    def _path(self, suffix: str) -> str:
        base = self._parsed.path.rstrip("/")
        return f"{base}{suffix}"

    def _kv_from_metrics(self) -> int:
        """Read ``vllm:cache_config_info`` (``num_gpu_blocks`` x ``block_size``) from
        ``/metrics``; a clear error asks for ``--max-kv-tokens`` when it is not there."""
        try:
            conn = self._connection()
            conn.request("GET", self._path("/metrics"))
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace") if resp.status == 200 else ""
            conn.close()
        except OSError as exc:
            raise ProfilingError(f"cannot reach {self.url}/metrics: {exc}") from None
        match = re.search(r"^vllm:cache_config_info\{([^}]*)\}", text, re.MULTILINE)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            try:
                return int(labels["num_gpu_blocks"]) * int(labels["block_size"]) * self.dp
            except (KeyError, ValueError):
                pass
        raise ProfilingError(
            f"{self.url}/metrics does not report vllm:cache_config_info; pass --max-kv-tokens"
        )

    def _prompt(self, isl: int) -> list[int]:
        lo, hi = self._vocab
        with self._lock:
            return [self._rng.randrange(lo, hi) for _ in range(isl)]

    def stream(self, isl: int, osl: int) -> StreamResult:
        """Send one streamed completion; returns its TTFT, ITL and token count."""
        body = json.dumps(
            {
                "model": self.model,
                "prompt": self._prompt(isl),
                "max_tokens": osl,
                "min_tokens": osl,
                "ignore_eos": True,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
        try:
            conn = self._connection()
            start = time.perf_counter()
            conn.request(
                "POST",
                self._path("/v1/completions"),
                body=body,
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
            )
            resp = conn.getresponse()
            if resp.status != 200:
                detail = resp.read(300).decode("utf-8", "replace")
                conn.close()
                raise ProfilingError(
                    f"{self.url}/v1/completions answered HTTP {resp.status}: {detail}"
                )
            first = last = None
            chunks = 0
            usage_tokens = None
            while True:
                line = resp.readline()
                if not line:
                    break
                text = line.decode("utf-8", "replace").strip()
                if not text.startswith("data:"):
                    continue
                payload = text[5:].strip()
                if payload == "[DONE]":
                    break
                try:
                    event = json.loads(payload)
                except json.JSONDecodeError:
                    raise ProfilingError(
                        f"{self.url}: a stream event is not JSON: {payload[:120]!r}"
                    ) from None
                usage = event.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    usage_tokens = int(usage["completion_tokens"])
                if event.get("choices"):
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    last = now
                    chunks += 1
            conn.close()
        except OSError as exc:
            raise ProfilingError(f"cannot stream from {self.url}: {exc}") from None
        if first is None or last is None:
            raise ProfilingError(f"{self.url}: the stream carried no tokens")
        tokens = usage_tokens if usage_tokens is not None else chunks
        itl = (last - first) / (tokens - 1) if tokens > 1 and last > first else None
        return StreamResult(ttft_s=first - start, itl_s=itl, tokens=tokens)

    def _concurrent(self, n: int, work: Callable[[], None]) -> None:
        errors: list[BaseException] = []

        def run() -> None:
            try:
                work()
            except BaseException as exc:  # surfaced below, in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=run, daemon=True) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    # -- SweepTarget ---------------------------------------------------------------------------
    def prefill_ttft_ms(self, isl: int, *, concurrent: int) -> float:
        results: list[StreamResult] = []

        def one() -> None:
            r = self.stream(isl, 1)
            with self._lock:
                results.append(r)

        self._concurrent(max(1, concurrent), one)
        return 1000.0 * float(np.mean([r.ttft_s for r in results]))

    def decode_point(
        self, isl: int, osl: int, *, concurrency: int, measured: int
    ) -> DecodeMeasurement:
        # The client cannot see when a request is between prefill and decode, so the
        # closed loop's concurrency stands for the running batch (as Dynamo's profiler does).
        remaining = [concurrency + measured]  # one warm-up request per worker, then measured
        itls: list[float] = []

        def worker() -> None:
            warm = True
            while True:
                with self._lock:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                r = self.stream(isl, osl)
                if not warm and r.itl_s is not None:
                    with self._lock:
                        itls.append(r.itl_s)
                warm = False

        self._concurrent(concurrency, worker)
        if not itls:
            raise ProfilingError(f"{self.url}: no ITL measured at ISL {isl} x {concurrency}")
        return DecodeMeasurement(itl_ms=1000.0 * float(np.mean(itls)), running=float(concurrency))


def endpoint_manifest(
    endpoint: HttpEndpoint, *, gpu: str, backend: str, tool: str, tp: int, dp: int
) -> ProfileManifest:
    shape = EngineShape(tp=tp, dp=dp, gpus_per_engine=endpoint.gpus)
    return ProfileManifest(
        model=endpoint.model,
        gpu=gpu,
        backend=backend,
        source="measured",
        tool=tool,
        date=_dt.date.today().isoformat(),
        engine=shape,
        prefill_engine=shape,
        decode_engine=shape,
        extra={"endpoint": endpoint.url},
    )
