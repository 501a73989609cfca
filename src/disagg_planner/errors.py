"""User-facing errors and the exit codes the command line maps them to.

Every error a user can cause derives from :class:`PlannerError`; ``SpecError`` marks mistakes
in what the user gave us (config, profile, trace), so classifying an error is one
``isinstance``. The numeric libraries (``interpolation``, ``predictors`` ...) may not import
this module; they raise their own ``ValueError`` subclasses, which
:func:`classify` maps onto the same exit codes.
"""

from __future__ import annotations

from dataclasses import dataclass


class PlannerError(Exception):
    """Base of every error reported to a user without a traceback."""

    exit_code: int = 1
    kind: str = "error"


class SpecError(PlannerError):
    """The user's input is wrong: fixing the input fixes the error."""

    exit_code = 2
    kind = "invalid input"


@dataclass(frozen=True)
class ConfigProblem:
    """One violated rule of the configuration: where, what value, which rule."""

    path: str
    value: object
    rule: str
    source: str | None = None

    def render(self) -> str:
        where = f" (from {self.source})" if self.source else ""
        return f"{self.path} = {self.value!r}{where}: {self.rule}"


class ConfigError(SpecError):
    """The configuration is invalid; carries every problem found, not just the first."""

    kind = "invalid configuration"

    def __init__(self, problems: list[ConfigProblem] | str) -> None:
        if isinstance(problems, str):
            problems = [ConfigProblem(path="config", value=None, rule=problems)]
        self.problems = problems
        super().__init__("; ".join(p.render() for p in problems))


class ProfileError(SpecError):
    """A performance profile is missing or malformed."""

    kind = "invalid profile"


class TraceError(SpecError):
    """A request trace is missing or malformed."""

    kind = "invalid trace"


class DeploymentError(PlannerError):
    """The target deployment (DGD) is missing or does not have the expected shape."""

    exit_code = 3
    kind = "deployment error"


class ConnectorError(PlannerError):
    """The actuation backend (Kubernetes API, etcd, engine admin API) refused or failed."""

    exit_code = 4
    kind = "connector error"


# Errors raised by the numeric libraries, which may not import this module. Each entry maps
# the library's error class (by module and name, imported lazily) to our class.
_FOREIGN_USER_ERRORS: dict[tuple[str, str], type[PlannerError]] = {}


def register_foreign_error(module: str, name: str, as_type: type[PlannerError]) -> None:
    """Treat ``module.name`` (an exception class of a library layer) as ``as_type``."""
    _FOREIGN_USER_ERRORS[(module, name)] = as_type


def classify(exc: BaseException) -> type[PlannerError] | None:
    """The user-facing error class ``exc`` belongs to, or None for a bug."""
    if isinstance(exc, PlannerError):
        return type(exc)
    for klass in type(exc).__mro__:
        mapped = _FOREIGN_USER_ERRORS.get((klass.__module__, klass.__name__))
        if mapped is not None:
            return mapped
    return None


def is_spec_error(exc: BaseException) -> bool:
    """A mistake in what the user gave (config, profile), ours or a library layer's."""
    kind = classify(exc)
    return kind is not None and issubclass(kind, SpecError)


# The library layers' user-facing errors (registered by name: no import needed here).
register_foreign_error("disagg_planner.profiles.errors", "ProfileError", ProfileError)
register_foreign_error("disagg_planner.predictors.traces.errors", "TraceError", TraceError)
register_foreign_error("disagg_planner.simulator.errors", "SimulatorInputError", SpecError)
