"""``planner profile show|plot|list``: inspect performance profiles; ``planner profile
--engine ENGINE -o DIR``: make one (the sweep lives in :mod:`disagg_planner.cli.profile_sweep`).

The ``profile`` parser takes no required action: its own options are the sweep's, and with
neither an action nor sweep options it prints its help and exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from disagg_planner.cli.profile_sweep import add_sweep_arguments, run_sweep
from disagg_planner.errors import ProfileError, SpecError, register_foreign_error
from disagg_planner.profiles import Profile, list_bundled, load_profile, resolve_profile
from disagg_planner.profiles.registry import bundled_profiles_root
from disagg_planner.simulator import engine_spec as engine_specs
from disagg_planner.simulator.profiling import bundled_path

register_foreign_error("disagg_planner.profiles.errors", "ProfileError", ProfileError)

Handler = Callable[[argparse.Namespace], int]

_TABLE_ROWS = 6
_TABLE_ITL_TARGETS = 4


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "profile",
        help="Inspect performance profiles (Dynamo's NPZ layout) and list the bundled ones.",
        description="Inspect performance profiles: prefill TTFT/throughput by ISL and decode "
        "ITL/throughput by KV usage and context length. A profile is a directory in "
        "Dynamo's layout or the name of a bundled profile (see `planner profile list`). "
        "With --engine and -o instead of an action, sweep an engine and write a profile.",
    )
    add_sweep_arguments(parser)
    actions = parser.add_subparsers(dest="profile_action", metavar="ACTION")

    show = actions.add_parser(
        "show",
        help="Answer a capacity query on a profile, or summarise it.",
        description="With --isl: prefill TTFT and throughput at that ISL. With --itl: the "
        "best decode throughput per GPU whose ITL meets the target at a context length "
        "(--context-length, or isl + osl/2 from --isl and --osl). Without a query: a short "
        "table over the profiled range.",
    )
    show.add_argument("profile", metavar="DIR|NAME", help="Profile directory or bundled name.")
    show.add_argument("--isl", metavar="N", help="Input sequence length, tokens.")
    show.add_argument("--osl", metavar="N", help="Output sequence length, tokens.")
    show.add_argument("--itl", metavar="MS", help="ITL target, ms.")
    show.add_argument("--context-length", metavar="N", help="Decode context length, tokens.")
    show.add_argument("--json", action="store_true", help="Print the answer as JSON.")
    show.set_defaults(profile_handler=_show)

    plot = actions.add_parser(
        "plot",
        help="Write Plotly figures of a profile to an HTML file.",
        description="Write the prefill curves and decode ITL/throughput surfaces, with the "
        "profiled samples, to a standalone HTML file.",
    )
    plot.add_argument("profile", metavar="DIR|NAME", help="Profile directory or bundled name.")
    plot.add_argument("-o", "--output", required=True, metavar="FILE.html", help="Output file.")
    plot.add_argument(
        "--cdn",
        action="store_true",
        help="Load plotly.js from its CDN instead of inlining it (a smaller file that needs "
        "internet access to view).",
    )
    plot.set_defaults(profile_handler=_plot)

    listing = actions.add_parser(
        "list",
        help="List the bundled profiles with their manifests.",
        description="List the bundled profiles (under $PLANNER_PROFILES_DIR, else the "
        "repository's profiles/ folder) with the summary of each one's profile.yaml.",
    )
    listing.add_argument("--json", action="store_true", help="Print the list as JSON.")
    listing.set_defaults(profile_handler=_list)

    parser.set_defaults(handler=partial(_run, parser))


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    action: Handler | None = getattr(args, "profile_handler", None)
    if action is not None:
        return action(args)
    if getattr(args, "engine", None) or getattr(args, "sweep_output", None):
        return run_sweep(args)
    parser.print_help()
    return 2


# --- show ----------------------------------------------------------------------------------


def _number(args: argparse.Namespace, name: str) -> float | None:
    """The positive number given as ``--name``, or None; a SpecError (one line) otherwise."""
    raw = getattr(args, name)
    if raw is None:
        return None
    flag = "--" + name.replace("_", "-")
    try:
        value = float(raw)
    except ValueError:
        raise SpecError(f"{flag} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"{flag} must be a positive number, got {raw!r}")
    return value


def _plain(value: float) -> float | int:
    return int(value) if float(value).is_integer() else float(value)


def _load(name_or_dir: str) -> Profile:
    return load_profile(resolve_profile(name_or_dir))


def _show(args: argparse.Namespace) -> int:
    isl, osl = _number(args, "isl"), _number(args, "osl")
    itl, context = _number(args, "itl"), _number(args, "context_length")
    if itl is not None and context is None:
        if isl is None or osl is None:
            raise SpecError(
                "--itl needs --context-length, or --isl and --osl (context = isl + osl/2)"
            )
        context = isl + osl / 2
    if itl is None and context is not None:
        raise SpecError(
            "--context-length needs --itl (the decode query is the best "
            "throughput under an ITL target)"
        )
    profile = _load(args.profile)
    answer = capacity_answer(profile, isl=isl, itl=itl, context=context)
    if args.json:
        print(json.dumps(answer))
    elif isl is None and itl is None:
        print(_summary(profile))
    else:
        print(_answer_text(profile, answer))
    return 0


def capacity_answer(
    profile: Profile, *, isl: float | None, itl: float | None, context: float | None
) -> dict[str, Any]:
    """The profile's answer at a prefill ISL and/or a decode (ITL target, context length),
    each with ``extrapolated`` and its ``note`` (the profile's own lookups decide): what
    ``profile show`` prints, and what ``plan`` sized on."""
    answer: dict[str, Any] = {}
    if isl is not None:
        point = profile.prefill.lookup(isl)
        answer["prefill"] = {
            "isl": _plain(isl),
            "ttft_ms": point.ttft_ms,
            "thpt_per_gpu": point.thpt_per_gpu,
            "extrapolated": point.extrapolated,
            "note": point.note,
        }
    if itl is not None and context is not None:
        best = profile.decode.find_best_throughput_per_gpu(itl, context)
        answer["decode"] = {
            "context_length": _plain(context),
            "itl_target_ms": _plain(itl),
            "best_thpt_per_gpu": best.thpt_per_gpu,
            "itl_ms": best.itl_ms,
            "kv_usage": best.kv_usage,
            "feasible": best.feasible,
            "extrapolated": best.extrapolated,
            "note": best.note,
        }
    answer["max_kv_tokens"] = profile.max_kv_tokens
    return answer


def _header(profile: Profile) -> list[str]:
    lines = [f"profile        {profile.source_dir}"]
    if profile.manifest is not None:
        lines.append(f"manifest       {profile.manifest.summary()}")
    lines.append(f"max_kv_tokens  {profile.max_kv_tokens}")
    return lines


def _answer_text(profile: Profile, answer: dict[str, Any]) -> str:
    lines = _header(profile)
    if "prefill" in answer:
        p = answer["prefill"]
        note = f" (extrapolated: {p['note']})" if p["extrapolated"] else ""
        lines.append(
            f"prefill        ISL {p['isl']:g}: TTFT {p['ttft_ms']:.2f} ms, "
            f"{p['thpt_per_gpu']:.0f} tokens/s/GPU{note}"
        )
    if "decode" in answer:
        d = answer["decode"]
        where = f"context {d['context_length']:g}, ITL target {d['itl_target_ms']:g} ms"
        if d["feasible"]:
            text = (
                f"{d['best_thpt_per_gpu']:.0f} tokens/s/GPU at ITL {d['itl_ms']:.2f} ms, "
                f"KV usage {d['kv_usage']:.3f}"
            )
        else:
            text = (
                f"infeasible: the lowest ITL at this context is {d['itl_ms']:.2f} ms "
                f"(KV usage {d['kv_usage']:.3f})"
            )
        if d["extrapolated"]:
            text += f" (extrapolated: {d['note']})"
        lines.append(f"decode         {where}: {text}")
    return "\n".join(lines)


def _summary(profile: Profile) -> str:
    """A short table over the profiled range: prefill at the sampled ISLs (at most a few) and
    the best decode throughput per GPU for a few context lengths and ITL targets."""
    pre, dec = profile.prefill, profile.decode
    lines = _header(profile)
    kinds = pre.kinds
    lines.append(
        f"\nprefill ({pre.data.isl.size} points, TTFT {kinds['ttft_ms']}, "
        f"throughput {kinds['thpt_per_gpu']})"
    )
    lines.append(f"  {'ISL':>9}  {'TTFT ms':>9}  {'tokens/s/GPU':>12}")
    isl = pre.data.isl
    if isl.size > _TABLE_ROWS:
        isl = np.linspace(isl[0], isl[-1], _TABLE_ROWS)
    for x in isl:
        point = pre.lookup(float(x))
        lines.append(f"  {x:>9.0f}  {point.ttft_ms:>9.2f}  {point.thpt_per_gpu:>12.0f}")

    lo, hi = dec.context_range
    contexts = np.unique(np.round(np.linspace(lo, hi, _TABLE_ROWS)))
    itl_lo, itl_hi = float(dec.data.itl_ms.min()), float(dec.data.itl_ms.max())
    targets = np.unique(np.round(np.linspace(itl_lo, itl_hi, _TABLE_ITL_TARGETS + 1)[1:], 2))
    lines.append(
        f"\ndecode ({dec.data.kv_usage.size} points, contexts {lo:g}-{hi:g}, "
        f"ITL {itl_lo:.2f}-{itl_hi:.2f} ms): best tokens/s/GPU with ITL <= target"
    )
    lines.append(f"  {'context':>9}" + "".join(f"  {f'<={t:g} ms':>12}" for t in targets))
    for ctx in contexts:
        cells = []
        for t in targets:
            best = dec.find_best_throughput_per_gpu(float(t), float(ctx))
            cells.append(f"{best.thpt_per_gpu:>12.0f}" if best.feasible else f"{'-':>12}")
        lines.append(f"  {ctx:>9.0f}" + "".join(f"  {c}" for c in cells))
    return "\n".join(lines)


# --- plot and list ---------------------------------------------------------------------------


def _plot(args: argparse.Namespace) -> int:
    from disagg_planner.profiles.plot import write_profile_html  # plotly loads only for this action

    profile = _load(args.profile)
    out = write_profile_html(profile, args.output, include_plotlyjs="cdn" if args.cdn else True)
    print(f"wrote {out}")
    return 0


def bundled_profile_of(engine: str) -> str | None:
    """The name of the bundled profile of ``engine`` (``sim:MODEL@GPU[:tpN]``), if there is
    one: bundled profiles live at ``<gpu>/<backend>/<model>/<parallelism>``, the path the
    profile sweep writes for that engine."""
    name = bundled_path("", engine_specs.parse(engine)).as_posix()
    return name if name in {n for n, _ in list_bundled()} else None


def missing_engine_profile(engine: str) -> SpecError:
    """What to do when ``engine`` is simulated with the throughput loop on and no profile of
    it is given or bundled."""
    return SpecError(
        f"--engine {engine}: the throughput loop sizes from a profile of this engine, and none "
        "is bundled; make one with `planner profile --engine "
        f"{engine} -o DIR` and pass --profile-results-dir DIR, or pass --profile NAME "
        "(planner profile list), or replay without throughput scaling "
        "(--no-enable-throughput-scaling --enable-load-scaling)"
    )


def _list(args: argparse.Namespace) -> int:
    bundled = list_bundled()
    if args.json:
        print(json.dumps([{"name": n, "manifest": m.to_dict() if m else None} for n, m in bundled]))
        return 0
    if not bundled:
        print(f"no bundled profiles under {bundled_profiles_root()}", file=sys.stderr)
        return 0
    width = max(len(name) for name, _ in bundled)
    for name, manifest in bundled:
        print(f"{name:<{width}}  {manifest.summary() if manifest else '(no profile.yaml)'}")
    return 0
