"""Where tests and benchmarks find the real, third-party request traces.

Third-party data stays out of the repository: the traces live in ``$PLANNER_TRACE_DIR``,
by default ``../shared/traces`` seen from the repository root (where CI has the folder,
beside its clone); a relative value is taken from the repository root too, so the answer
does not depend on the working directory. Standard library only: the benchmarks import
this module as well, and pytest is not theirs to need (``tests/conftest.py`` turns a
missing trace into a skip, or a failure under CI).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TRACE_DIR_ENV = "PLANNER_TRACE_DIR"
DEFAULT_TRACE_DIR = "../shared/traces"


@dataclass(frozen=True)
class SharedTrace:
    name: str  # the file's name in the trace folder
    repo: str  # where to download it from
    path: str  # its path in that repository


AZURE_CONV = SharedTrace(
    "AzureLLMInferenceTrace_conv.csv",
    "https://github.com/Azure/AzurePublicDataset",
    "data/AzureLLMInferenceTrace_conv.csv",
)
MOONCAKE_CONV = SharedTrace(
    "mooncake_conversation_trace.jsonl",
    "https://github.com/kvcache-ai/Mooncake",
    "FAST25-release/traces/conversation_trace.jsonl",
)
# ServeGen's client descriptions: a folder per model (copy all of data/language/m-large/);
# its largest client's file stands for the folder.
SERVEGEN_M_LARGE = SharedTrace(
    "servegen/m-large/chunk-61-trace.csv",
    "https://github.com/alibaba/ServeGen",
    "data/language/m-large/chunk-61-trace.csv",
)


class TraceMissing(FileNotFoundError):
    """A shared trace is not where it is looked for; the message says how to get it."""


def trace_dir() -> Path:
    return (REPO_ROOT / os.environ.get(TRACE_DIR_ENV, DEFAULT_TRACE_DIR)).resolve()


def locate(trace: SharedTrace) -> Path:
    path = trace_dir() / trace.name
    if not path.is_file():
        raise TraceMissing(
            f"{path} is missing: download {trace.path} from {trace.repo} and save it as "
            f"{path}, or point {TRACE_DIR_ENV} at the folder that holds {trace.name}"
        )
    return path


def servegen_folder(model: str) -> Path:
    """Where the ServeGen folder of ``model`` (``m-large``, ``m-mid``, ``m-small``) is looked
    for; the ServeGen reader says so when it is missing."""
    return trace_dir() / "servegen" / model


def head(source: Path, lines: int, dest: Path) -> Path:
    """The first ``lines`` lines of ``source`` written to ``dest`` byte for byte (CRLF kept)."""
    with source.open("rb") as handle:
        dest.write_bytes(b"".join(islice(handle, lines)))
    return dest


def for_script(trace: SharedTrace) -> Path:
    """``locate`` for the benchmark scripts: a missing trace ends the script with the message."""
    try:
        return locate(trace)
    except TraceMissing as missing:
        raise SystemExit(f"error: {missing}") from None
