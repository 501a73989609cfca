"""The Dockerfile, statically: what it copies exists and survives .dockerignore, it installs
every package the project ships with CI's pins, and the image runs the chart's way (non-root
user, port, entrypoint). .ci/run re-enacts its install steps (dockerfile.py --emulate)."""

from __future__ import annotations

import shlex
import tomllib

import yaml

from disagg_planner.cli.main import build_parser
from tests.unit.deploy.conftest import CHART, REPO
from tests.unit.deploy.dockerfile import entrypoint, ignore_patterns, ignored, parse

ARGS, STAGES = parse()
BUILD, FINAL = STAGES
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def test_two_stages_on_a_python_311_slim_base():
    assert [s.name for s in STAGES] == ["build", None]
    for stage in STAGES:
        assert stage.base.startswith("python:3.11-"), stage.base
        assert not stage.base.endswith(":latest")
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"
    assert not [i for s in STAGES for i in s.instructions if i.keyword == "ADD"], "COPY, not ADD"


def test_every_copied_path_is_in_the_build_context():
    patterns = ignore_patterns()
    for step in BUILD.of("COPY"):
        *sources, _ = shlex.split(step.args)
        for source in sources:
            path = REPO / source
            assert path.exists(), f"Dockerfile:{step.line}: {source} does not exist"
            assert not ignored(source.rstrip("/"), patterns), f"{source} is in .dockerignore"


def test_every_shipped_package_is_copied():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    where = pyproject["tool"]["setuptools"]["packages"]["find"]["where"]
    copied = {shlex.split(s.args)[0].rstrip("/") for s in BUILD.of("COPY")}
    assert set(where) <= copied, f"not copied into the image: {sorted(set(where) - copied)}"
    assert {"pyproject.toml", "README.md", "ci-constraints.txt"} <= set(
        shlex.split(BUILD.of("COPY")[0].args)[:-1]
    )


def test_the_install_uses_ci_pins_and_wheels_only():
    (run,) = BUILD.of("RUN")
    assert "-c ci-constraints.txt ." in run.args
    assert "--only-binary=:all:" in run.args
    assert "--no-cache-dir" in run.args


def test_bundled_profiles_come_with_the_package_not_a_variable():
    # The profiles are package data of the wheel; an image that still needed
    # PLANNER_PROFILES_DIR would hide a wheel that ships without them.
    env = " ".join(s.args for s in FINAL.of("ENV"))
    assert "PLANNER_PROFILES_DIR" not in env
    assert "PATH=/opt/planner/bin:$PATH" in env


def test_the_image_runs_as_the_charts_non_root_user_on_its_port():
    (user,) = FINAL.of("USER")
    uid, _, gid = user.args.partition(":")
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root user (runAsNonRoot checks it)"
    assert int(uid) == VALUES["podSecurityContext"]["runAsUser"]
    assert int(gid) == VALUES["podSecurityContext"]["runAsGroup"]
    (expose,) = FINAL.of("EXPOSE")
    assert int(expose.args) == VALUES["metrics"]["port"]


def test_the_default_command_is_a_valid_planner_operator_command():
    command = entrypoint(FINAL)
    assert command[0] == "planner"
    args = build_parser().parse_args(command[1:])
    assert args.command == "operator" and args.operator_all_namespaces


def test_dockerignore_keeps_local_state_out():
    patterns = ignore_patterns()
    for path in (
        ".git",
        ".venv",
        "tests/unit",
        "src/disagg_planner/__pycache__/x.pyc",
        "x.egg-info",
    ):
        assert ignored(path, patterns), path
    for path in (
        "src/disagg_planner/cli/main.py",
        "src/disagg_planner/profiles/bundled/README.md",
        "ci-constraints.txt",
    ):
        assert not ignored(path, patterns), path
