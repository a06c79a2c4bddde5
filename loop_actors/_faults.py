"""Named crash points, for crash tests only.

Switched on by one environment variable that tests set::

    LOOP_ACTORS_CRASH_AT=after_dispatch_commit        # the first time that point is reached
    LOOP_ACTORS_CRASH_AT=after_results_commit:2       # the second time

When the named point is reached the process kills itself with SIGKILL: no
cleanup, no flush, no ``finally`` blocks, exactly like ``kill -9``. Without the
variable every point is a no-op (one dictionary lookup).
"""

from __future__ import annotations

import os
import signal
from enum import StrEnum

CRASH_ENV = "LOOP_ACTORS_CRASH_AT"


class CrashPoint(StrEnum):
    """Where the runtime can be told to die."""

    AFTER_START_COMMIT = "after_start_commit"
    """``InvocationStarted`` is durable; the model was not asked yet."""
    AFTER_DISPATCH_COMMIT = "after_dispatch_commit"
    """``BatchDispatched`` (and its effects) are durable; no call has started."""
    AFTER_WRITE_RETURNED = "after_write_returned"
    """A write tool returned (its service committed); nothing of it is recorded yet."""
    AFTER_RESULTS_COMMIT = "after_results_commit"
    """``ResultsCommitted`` is durable; the model was not asked again yet."""
    BEFORE_FINAL_COMMIT = "before_final_commit"
    """The final answer is decided; ``Terminated`` is not yet committed."""
    BEFORE_CRITIQUE = "before_critique"
    """A final answer (and the critic's earlier rounds) are durable; the critic was not
    asked yet (an agent with a critic)."""
    AFTER_CRITIQUE_COMMIT = "after_critique_commit"
    """The critic's ``revise`` verdict is durable; the agent's model was not asked again."""
    AFTER_SUBMIT_CHUNK_COMMIT = "after_submit_chunk_commit"
    """A chunk of a bulk submission is durable, with its queue rows; the next is not written."""
    AFTER_SCHEDULE_DECIDED = "after_schedule_decided"
    """A worker's check of a schedule decided runs (the schedule moved on); none is submitted."""
    BEFORE_HANDOFF_SUBMIT = "before_handoff_submit"
    """A worker's run ended ``handed_off`` (durable); its target is not yet submitted."""
    PROJECTION_BATCH_APPLIED = "projection_batch_applied"
    """A read model applied a batch of events; its transaction is not yet committed."""


def _armed() -> tuple[CrashPoint, int] | None:
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return None
    name, _, count = spec.partition(":")
    return CrashPoint(name), int(count or "1")


_ARMED = _armed()
_reached: dict[CrashPoint, int] = {}


def fault_point(point: CrashPoint) -> None:
    """Die here (SIGKILL) if ``$LOOP_ACTORS_CRASH_AT`` names this point and occurrence."""
    if _ARMED is None or _ARMED[0] is not point:
        return
    _reached[point] = _reached.get(point, 0) + 1
    if _reached[point] == _ARMED[1]:
        os.kill(os.getpid(), signal.SIGKILL)
