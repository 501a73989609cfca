"""The DGD connector's state that survives restarts: written with its changes, read back by
a restarted or failed-over planner (the pure encoding is :mod:`.state`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from disagg_planner.connectors.base import (
    Hold,
    HoldReason,
)
from disagg_planner.connectors.kubernetes.api import (
    DGD_PLURAL,
)
from disagg_planner.connectors.kubernetes.parts import (
    _CONVERGING,
    ConnectorParts,
    _Observation,
    _shows_state,
)
from disagg_planner.connectors.kubernetes.state import (
    STATE_ANNOTATION,
    ForeignStateError,
    PlannerState,
    decode_state,
    encode_state,
    remaining_holds,
    resumed_baseline,
)
from disagg_planner.errors import ConnectorError, DeploymentError

log = logging.getLogger(__name__)


class Resume(ConnectorParts):
    """The restart state (a part of :class:`KubernetesConnector`)."""

    # --- state that survives restarts -----------------------------------------------------------

    def _state_json(self) -> str:
        """What a restarted or failed-over planner needs, as the annotation's JSON: what the
        planner set (and is writing) per role, its last change and the manual-edit holds."""
        now, wall = self._clock(), self._wall()
        return encode_state(
            PlannerState(
                uid=self._uid,
                set=self._expected,
                pending=self._pending,
                holds={
                    role: wall + (hold.until_s - now)
                    for role, hold in self._holds.items()
                    if hold.reason is HoldReason.MANUAL_OVERRIDE and hold.until_s is not None
                },
                last_action=self._last_action,
            )
        )

    async def _record_state(self) -> None:
        """Patch the state annotation alone; a failure is logged (the next write retries).
        Advisory: nothing (a planner that never writes replicas writes nothing at all)."""
        if self._settings.advisory:
            return
        state = self._state_json()
        body = {"metadata": {"annotations": {STATE_ANNOTATION: state}}}
        try:
            answer = await self._api.patch_dgd(body, what="record the planner's state")
            self._note_write(DGD_PLURAL, self.dgd_name, answer, _shows_state(state))
        except (ConnectorError, DeploymentError) as exc:
            log.warning("DGD %s: could not record the planner's state: %s", self._ref, exc)

    def _restore(self, dgd: Mapping[str, Any]) -> None:
        """Read back the state annotation of the DGD as first seen by this process: the
        planner's own values (so that they are not taken for manual edits, and an edit
        made while no planner ran is one), the holds still running, and a change still
        converging (waited for, :meth:`_follow_resumed_wait`)."""
        annotations = (dgd.get("metadata") or {}).get("annotations") or {}
        raw = annotations.get(STATE_ANNOTATION) if isinstance(annotations, Mapping) else None
        if raw is None:
            return
        try:
            state = decode_state(raw, uid=self._uid, roles=self._roles)
        except ForeignStateError as exc:
            log.info(
                "DGD %s: annotation %s is of another object (uid %s); starting afresh",
                self._ref,
                STATE_ANNOTATION,
                exc.uid,
            )
            return
        except ValueError as exc:
            log.warning(
                "DGD %s: ignoring annotation %s (%s); starting afresh",
                self._ref,
                STATE_ANNOTATION,
                exc,
            )
            return
        now, wall = self._clock(), self._wall()
        holds = {
            role: Hold(
                role=role,
                reason=HoldReason.MANUAL_OVERRIDE,
                detail="replicas changed by someone else; respected for another "
                f"{remaining:.0f} s (read back after a restart)",
                until_s=now + remaining,
            )
            for role, remaining in remaining_holds(state, wall).items()
        }
        expected, pending = resumed_baseline(state)
        waiting = (
            None
            if state.last_action is None
            else (state.last_action[0], dict(state.last_action[1]))
        )
        self._pending.update(pending)
        self._expected.update(expected)
        self._holds.update(holds)
        self._last_action = waiting
        self._resumed_wait = waiting
        log.info(
            "DGD %s: resumed the planner's state: set %s%s%s",
            self._ref,
            expected,
            f", holding {sorted(holds)} after a manual edit" if holds else "",
            f", last change {waiting[1]} {wall - waiting[0]:.0f} s ago" if waiting else "",
        )

    def _follow_resumed_wait(self, obs: _Observation) -> None:
        """While a change read back after a restart has not converged (some role runs fewer
        ready replicas than it asks for) and is younger than the convergence timeout, hold
        every role: the planner that made it would have waited, so this one does too."""
        if self._resumed_wait is None:
            return
        at, targets = self._resumed_wait
        age = self._wall() - at
        not_ready = {
            role: f"{obs.ready[role]}/{obs.desired[role]}"
            for role in self._roles
            if obs.ready[role] != obs.desired[role]
        }
        timeout = self._settings.convergence_timeout_s
        if not not_ready or age >= timeout:
            if not_ready:
                log.warning(
                    "DGD %s: the change %s made before the restart did not converge within "
                    "%g s (%s ready); planning resumes",
                    self._ref,
                    targets,
                    timeout,
                    ", ".join(f"{r} {n}" for r, n in not_ready.items()),
                )
            self._resumed_wait = None
            for role in [r for r, h in self._holds.items() if h.reason is _CONVERGING]:
                del self._holds[role]
            return
        detail = (
            f"the change {targets} made {age:.0f} s ago, before this planner started, has not "
            f"converged ({', '.join(f'{r} {n} ready' for r, n in not_ready.items())}); waiting "
            f"up to {timeout - age:.0f} s more"
        )
        until = self._clock() + (timeout - age)
        for role in self._roles:
            current = self._holds.get(role)
            if current is None or current.reason is _CONVERGING:
                self._holds[role] = Hold(role, _CONVERGING, detail, until_s=until)
