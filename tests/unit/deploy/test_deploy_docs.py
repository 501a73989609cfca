"""docs/deploy.md: every command it gives names what exists (files, chart values, `planner`
flags), the image it builds is the one the chart runs, and its namespace and token secret are
the examples'."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import yaml

from disagg_planner.cli.main import build_parser
from tests.unit.deploy.conftest import CHART, REPO

DOC = REPO / "docs" / "deploy.md"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))


def blocks() -> list[list[list[str]]]:
    """The page's bash blocks, each a list of commands split as the shell splits them
    (continuation lines joined, a trailing ``&`` dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.DOTALL):
        commands = []
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[-1] == "&":
                words.pop()
            if words:
                commands.append(words)
        out.append(commands)
    return out


COMMANDS = [command for block in blocks() for command in block]


def option(command: list[str], name: str) -> list[str]:
    """Every value given to ``name`` in ``command`` (``--set a=b --set c=d``)."""
    return [command[i + 1] for i, word in enumerate(command[:-1]) if word == name]


def value_at(path: str) -> Any:
    node: Any = VALUES
    for key in path.split("."):
        assert isinstance(node, dict) and key in node, f"--set {path}: no such chart value"
        node = node[key]
    return node


def test_the_page_has_the_commands_it_promises() -> None:
    tools = {command[0] for command in COMMANDS}
    assert {"kubectl", "docker", "kind", "helm", "planner"} <= tools


@pytest.mark.parametrize(
    "command", [c for c in COMMANDS if c[0] == "planner"], ids=lambda c: " ".join(c[:2])
)
def test_every_planner_command_parses_with_the_real_cli(command: list[str]) -> None:
    args = build_parser().parse_args(command[1:])
    assert args.command == command[1]


def test_every_file_and_chart_value_named_exists() -> None:
    for command in COMMANDS:
        for path in option(command, "-f"):
            assert (REPO / path).exists(), f"{shlex.join(command)}: {path} does not exist"
        if command[:2] == ["helm", "install"]:
            assert (REPO / command[3]).resolve() == CHART
            for setting in option(command, "--set"):
                value_at(setting.partition("=")[0])
        if command[:2] == ["docker", "build"]:
            assert command[-1] == "." and (REPO / "Dockerfile").is_file()


def test_the_image_built_is_the_image_the_chart_runs() -> None:
    for block in blocks():
        built = {option(c, "-t")[0] for c in block if c[:2] == ["docker", "build"]}
        loaded = {c[3] for c in block if c[:3] == ["kind", "load", "docker-image"]}
        assert loaded <= built, f"kind loads {loaded - built}, which was not built"
        for command in (c for c in block if c[:2] == ["helm", "install"]):
            settings = dict(s.partition("=")[::2] for s in option(command, "--set"))
            repository = settings.get("image.repository", VALUES["image"]["repository"])
            tag = settings.get("image.tag", VALUES["image"]["tag"] or APP_VERSION)
            assert f"{repository}:{tag}" in built, f"{shlex.join(command)} runs an unbuilt image"
        if loaded:
            # a loaded image is never pulled: the chart must not ask for a pull
            assert VALUES["image"]["pullPolicy"] == "IfNotPresent"


def example_dgds() -> list[dict[str, Any]]:
    return [
        d
        for path in EXAMPLES
        for d in yaml.safe_load_all(path.read_text())
        if d and d["kind"] == "DynamoGraphDeployment"
    ]


def test_the_namespace_and_token_secret_are_the_examples() -> None:
    created = {c[3] for c in COMMANDS if c[:3] == ["kubectl", "create", "namespace"]}
    (secret,) = [c for c in COMMANDS if c[:4] == ["kubectl", "create", "secret", "generic"]]
    watched = {
        s.partition("=")[2].strip("{}")
        for c in COMMANDS
        if c[:2] == ["helm", "install"]
        for s in option(c, "--set")
        if s.startswith("watch.namespaces=")
    }
    assert example_dgds()
    for dgd in example_dgds():
        namespace = dgd["metadata"]["namespace"]
        assert namespace in created and namespace in watched
        assert option(secret, "-n") == [namespace]
        workers = [s for s in dgd["spec"]["services"].values() if s["componentType"] == "worker"]
        assert workers and all(w.get("envFromSecret") == secret[4] for w in workers)
    # the variable Hugging Face's libraries read
    assert any(word.startswith("--from-literal=HF_TOKEN=") for word in secret)
