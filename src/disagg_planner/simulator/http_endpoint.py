"""A real OpenAI-compatible endpoint as a profiling sweep's target (:class:`HttpEndpoint`),
and the manifest of a profile measured on one."""

from __future__ import annotations

import datetime as _dt
import http.client
import json
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from disagg_planner.profiles import EngineShape, ProfileManifest
from disagg_planner.simulator.errors import ProfilingError
from disagg_planner.simulator.sweep import DecodeMeasurement

# An endpoint does not say its context; this is what is assumed without --max-context-length.
DEFAULT_MAX_CONTEXT = 16384


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


__all__ = ["DEFAULT_MAX_CONTEXT", "HttpEndpoint", "StreamResult", "endpoint_manifest"]
