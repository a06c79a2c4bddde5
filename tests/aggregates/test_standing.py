"""The core's answers the shell used to spell out: stopped, standing, approval refusals...

And unrevealed calls. Bad inputs tried: every phase (each answer is checked against all
ten), a digest of another batch and no digest at all, a redacted value nested in a
list inside the arguments.
"""

from __future__ import annotations

import pytest

from aggregates.decisions import ErrorClass, ToolEffect
from aggregates.invocation import DispatchedCall, Phase
from aggregates.lease import QueueStatus
from aggregates.redaction import REDACTED
from aggregates.results import split_unrevealed
from aggregates.standing import (
    ApprovalRefusal,
    Standing,
    Stop,
    approval_refusal,
    resting_status,
    standing,
    stopped,
    waits_for_answer,
)
from tests.support.invocations import in_phase

PHASES = [phase for phase in Phase if phase is not Phase.NEW]

EXPECTED_STANDING = {
    Phase.TERMINATED: Standing.ENDED,
    Phase.AWAITING_APPROVAL: Standing.WAITS_FOR_PERSON,
    Phase.AWAITING_CLARIFICATION: Standing.WAITS_FOR_PERSON,
    # As the core alone sees it; the Driver looks at the child (Driver.standing).
    Phase.AWAITING_CHILD: Standing.WAITS_FOR_PERSON,
    Phase.SLEEPING: Standing.SLEEPING,
}


EXPECTED_STOP = {
    Phase.TERMINATED: Stop.ENDED,
    Phase.AWAITING_APPROVAL: Stop.PAUSED,
    Phase.AWAITING_CLARIFICATION: Stop.PAUSED,
    Phase.AWAITING_RECONCILIATION: Stop.PAUSED,
    Phase.AWAITING_CHILD: Stop.PAUSED,
    Phase.SLEEPING: Stop.PAUSED,
}
"""Finished or paused: every other phase (new, ready, proposed, decided, dispatched) is neither."""


@pytest.mark.parametrize("phase", list(Phase), ids=str)
def test_an_invocation_has_stopped_only_when_it_terminated_or_is_paused(phase: Phase) -> None:
    assert stopped(phase) is EXPECTED_STOP.get(phase)


@pytest.mark.parametrize("phase", list(Phase), ids=str)
def test_the_queue_row_of_an_undriven_invocation_rests_as_it_stopped(phase: Phase) -> None:
    """Ended once terminated, paused while it waits, else runnable: never claimed.

    A sleep is runnable: a worker that claims it wakes it when it is due.
    """
    resting = {
        None: QueueStatus.RUNNABLE,
        Stop.ENDED: QueueStatus.ENDED,
        Stop.PAUSED: QueueStatus.PAUSED,
    }
    expected = (
        QueueStatus.RUNNABLE if phase is Phase.SLEEPING else resting[EXPECTED_STOP.get(phase)]
    )
    assert resting_status(phase) is expected


@pytest.mark.parametrize("phase", PHASES, ids=str)
def test_only_an_ended_or_person_waiting_invocation_is_not_drivable(phase: Phase) -> None:
    assert standing(in_phase(phase)) is EXPECTED_STANDING.get(phase, Standing.DRIVABLE)


@pytest.mark.parametrize("phase", PHASES, ids=str)
def test_only_an_invocation_paused_with_a_question_waits_for_an_answer(phase: Phase) -> None:
    assert waits_for_answer(in_phase(phase)) is (phase is Phase.AWAITING_CLARIFICATION)


@pytest.mark.parametrize("phase", PHASES, ids=str)
def test_an_approval_is_refused_unless_the_invocation_waits_for_one(phase: Phase) -> None:
    refusal = approval_refusal(in_phase(phase), "digest")
    expected = None if phase is Phase.AWAITING_APPROVAL else ApprovalRefusal.NOT_WAITING
    assert refusal is expected


@pytest.mark.parametrize("digest", ["other", None])
def test_an_approval_of_another_digest_is_refused(digest: str | None) -> None:
    waiting = in_phase(Phase.AWAITING_APPROVAL)
    assert approval_refusal(waiting, digest) is ApprovalRefusal.OTHER_DIGEST


def _call(call_id: str, arguments: dict[str, object]) -> DispatchedCall:
    return DispatchedCall(
        call_id=call_id, name="pay", arguments=arguments, effect=ToolEffect.WRITE, effect_key="k"
    )


def test_a_call_whose_redacted_arguments_nobody_holds_does_not_run() -> None:
    calls = [
        _call("a", {"card": "4111"}),
        _call("b", {"cards": [{"number": REDACTED}]}),
        _call("c", {"card": REDACTED}),
    ]
    runnable, gone = split_unrevealed(calls)
    assert [c.call_id for c in runnable] == ["a"]
    assert sorted(gone) == ["b", "c"]
    assert all(r.error is not None for r in gone.values())
    assert {r.error.error_class for r in gone.values() if r.error} == {ErrorClass.INVALID_ARGUMENTS}


def test_calls_with_every_argument_revealed_all_run() -> None:
    calls = [_call("a", {"card": "4111"}), _call("b", {})]
    assert split_unrevealed(calls) == (calls, {})
