"""The repository's Dockerfile, read and (without Docker) re-enacted.

:func:`parse` reads the instructions (line continuations, ``ARG`` defaults in ``FROM``).
:func:`emulate` performs the build the way Docker would on this machine's Python: a context
filtered by .dockerignore, the build stage's ``COPY`` and ``RUN`` steps in a scratch root
(``/src`` and ``/opt/planner`` live under it), then the final stage's ``COPY --from=build``
and ``ENV``; it returns the environment of the finished image, so that its entrypoint can be
run. ``.ci/run`` calls it: ``python -m tests.unit.deploy.dockerfile --emulate DIR``. What it
cannot show: the base image's own packages (its Python is the host's 3.11) and the build
cache.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def of(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(path: Path = DOCKERFILE) -> tuple[dict[str, str], list[Stage]]:
    """Global ``ARG`` defaults and the stages, in order."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    logical: list[tuple[int, str]] = []
    buffer, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not buffer and (not line or line.startswith("#")):
            continue
        if buffer and line.startswith("#"):
            continue  # comment lines inside a continued instruction
        if not buffer:
            start = number
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        logical.append((start, buffer + line))
        buffer = ""
    for number, text in logical:
        keyword, _, rest = text.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), rest)
            image, _, alias = base.partition(" AS ")
            if not alias:
                image, _, alias = base.partition(" as ")
            stages.append(Stage(image.strip(), alias.strip() or None))
        else:
            if not stages:
                raise ValueError(f"{path}:{number}: {keyword} before FROM")
            stages[-1].instructions.append(Instruction(keyword, rest, number))
    return args, stages


def ignore_patterns(path: Path = DOCKERIGNORE) -> list[str]:
    patterns = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            if line.startswith("!"):
                raise ValueError(f"{path}: exceptions ({line}) are not supported here")
            patterns.append(line.strip("/"))
    return patterns


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether a context path (or a folder above it) matches a .dockerignore pattern."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        for prefix in prefixes:
            if fnmatch.fnmatchcase(prefix, pattern):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatchcase(
                prefix.rsplit("/", 1)[-1], pattern[3:]
            ):
                return True
    return False


def env_pairs(args: str) -> dict[str, str]:
    """``ENV A=1 B=2`` (the key=value form only)."""
    out = {}
    for token in shlex.split(args):
        key, sep, value = token.partition("=")
        if not sep:
            raise ValueError(f"ENV {args!r}: use the KEY=value form")
        out[key] = value
    return out


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), value)


def _copy_from_context(sources: list[str], dest: Path, patterns: list[str]) -> None:
    for source in sources:
        src = REPO / source.rstrip("/")
        if not src.exists() or ignored(source.rstrip("/"), patterns):
            raise FileNotFoundError(f"COPY {source}: not in the build context")
        if src.is_file():
            target = dest / src.name if dest.is_dir() or str(dest).endswith("/") else dest
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
            continue
        for path in src.rglob("*"):
            relative = path.relative_to(REPO).as_posix()
            if path.is_dir() or ignored(relative, patterns):
                continue
            target = dest / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


def emulate(root: Path) -> dict[str, str]:
    """Build into ``root`` (image paths under it); returns the final image's environment."""
    _, stages = parse()
    patterns = ignore_patterns()
    if len(stages) != 2 or stages[0].name != "build":
        raise ValueError("expected a 'build' stage and a final stage")
    build, final = stages
    env = {"PATH": os.environ["PATH"], "HOME": str(root / "tmp")}
    workdir = root
    for step in build.instructions:
        if step.keyword == "ENV":
            env.update({k: _expand(v, env) for k, v in env_pairs(step.args).items()})
        elif step.keyword == "WORKDIR":
            workdir = root / step.args.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif step.keyword == "COPY":
            *sources, dest = shlex.split(step.args)
            target = root / dest.lstrip("/") if dest.startswith("/") else workdir / dest
            if dest.endswith("/") or dest in (".", "./"):
                target.mkdir(parents=True, exist_ok=True)
            _copy_from_context(sources, target, patterns)
        elif step.keyword == "RUN":
            command = step.args.replace("/opt/", f"{root}/opt/")
            print(f"+ RUN (line {step.line}) {command}", flush=True)
            subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=workdir,
                env={**env, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"},
                check=True,
            )
        else:
            raise ValueError(f"Dockerfile:{step.line}: {step.keyword} not emulated in a build")
    image_env = {"PATH": os.environ["PATH"]}
    for step in final.instructions:
        if step.keyword == "ENV":
            pairs = env_pairs(step.args.replace("/opt/", f"{root}/opt/"))
            image_env.update({k: _expand(v, image_env) for k, v in pairs.items()})
        elif step.keyword == "COPY" and not step.args.startswith("--from=build "):
            raise ValueError(f"Dockerfile:{step.line}: the final stage copies from 'build'")
    image_env["HOME"] = str(root / "tmp")
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    return image_env


def entrypoint(stage: Stage) -> list[str]:
    """ENTRYPOINT + CMD (exec form) of a stage."""
    import json

    (entry,) = stage.of("ENTRYPOINT")
    (cmd,) = stage.of("CMD")
    return [*json.loads(entry.args), *json.loads(cmd.args)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--emulate", type=Path, required=True, metavar="DIR")
    args = parser.parse_args(argv)
    root = args.emulate.resolve()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    env = emulate(root)
    _, stages = parse()
    command = entrypoint(stages[-1])
    planner = shutil.which(command[0], path=env["PATH"])
    if planner is None or not planner.startswith(str(root)):
        raise SystemExit(f"the image's entrypoint {command[0]!r} is not on its PATH")
    checks = [
        [planner, *command[1:], "--help"],  # the default command parses
        [planner, "profile", "list"],  # the bundled profiles come with the wheel
    ]
    for check in checks:
        print("+", " ".join(check), flush=True)
        out = subprocess.run(check, env=env, cwd=root, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(check)} failed ({out.returncode}):\n{out.stderr}")
    listing = subprocess.run(
        [planner, "profile", "list"], env=env, cwd=root, capture_output=True, text=True, check=True
    ).stdout
    if "h200_sxm/vllm/llama-3.1-8b-fp8/tp1" not in listing:
        raise SystemExit(f"the image lists no bundled profiles:\n{listing}")
    print(f"image install steps OK ({root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
