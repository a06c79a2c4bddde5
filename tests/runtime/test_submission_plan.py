"""The plan of a bulk submission (``loop_actors.runtime.submission``), answered by a script.

No store: each step the plan asks for is answered here, so that what it asks, in which
order, and what it does with a conflict or a failure are seen directly.

Bad inputs tried: an id of another goal found before anything is written; one taken
by another goal (and one by the same goal) while the submission ran; a commit refused
as a conflict with no id taken; a commit that fails; a chunk size of 0; a goal that
is empty, blank or not a goal; an id in the runtime's namespace; an id given twice.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from aggregates.invocation import Invocation
from aggregates.lease import QueueStatus
from loop_actors import (
    Agent,
    ScriptedModel,
    StoreUnavailableError,
    Submission,
    SubmissionError,
    SubmissionProblem,
    UsageError,
)
from loop_actors.runtime.arguments import StartRequest, new_invocation
from loop_actors.runtime.submission import (
    AddRows,
    ChunkDone,
    CommitStarts,
    ReadInvocations,
    Stepper,
    SubmissionStep,
    SubmittedStatus,
    submission_requests,
    submission_steps,
)

AGENT = Agent("planner", ScriptedModel([]))
AT = datetime(2026, 1, 1, tzinfo=UTC)

Answer = Callable[[SubmissionStep], Any]


def requests(*goals: str | Submission) -> list[StartRequest]:
    return submission_requests(AGENT, goals, agent_ref="plans:agent")


def started(request: StartRequest, goal: str | None = None) -> Invocation:
    """The invocation a store would hold for ``request`` (of another goal, if given)."""
    other = StartRequest(
        agent=AGENT, goal=goal or request.goal, invocation_id=request.invocation_id
    )
    return new_invocation(other, at=AT)


def walk(
    plan: list[StartRequest], answer: Answer, *, chunk_size: int = 2
) -> tuple[list[SubmissionStep], Any]:
    """Every step the plan asks for, answered by ``answer``, and what it returned."""
    seen: list[SubmissionStep] = []
    stepper = Stepper(submission_steps(plan, chunk_size=chunk_size, now=lambda: AT))
    while (step := stepper.next()) is not None:
        seen.append(step)
        try:
            stepper.answered(answer(step))
        except StoreUnavailableError as error:
            stepper.failed(error)
    return seen, stepper.result


def store_answers(
    found: dict[str, Invocation] | None = None, *, commits: list[bool] | None = None
) -> Answer:
    """Answers of a store holding ``found``; each commit answered from ``commits`` (else True)."""
    held = found if found is not None else {}
    outcomes = list(commits or [])

    def answer(step: SubmissionStep) -> Any:
        match step:
            case ReadInvocations(invocation_ids=ids):
                return {i: held[i] for i in ids if i in held}
            case CommitStarts():
                return outcomes.pop(0) if outcomes else True
            case AddRows() | ChunkDone():
                return None
        raise AssertionError(step)

    return answer


def test_every_given_id_is_looked_up_before_the_first_commit() -> None:
    plan = requests(*(Submission(f"g{n}", invocation_id=f"id-{n}") for n in range(5)), "no id")
    seen, _ = walk(plan, store_answers())
    kinds = [type(step).__name__ for step in seen]
    assert kinds[:3] == ["ReadInvocations"] * 3  # 5 ids, 2 a read
    assert "CommitStarts" not in kinds[:3]
    reads = [step.invocation_ids for step in seen if isinstance(step, ReadInvocations)]
    assert reads == [["id-0", "id-1"], ["id-2", "id-3"], ["id-4"]]


def test_each_chunk_is_one_commit_of_its_starts_with_their_runnable_rows() -> None:
    plan = requests("a", "b", "c")
    seen, result = walk(plan, store_answers())
    commits = [step for step in seen if isinstance(step, CommitStarts)]
    assert [len(commit.events) for commit in commits] == [2, 1]
    assert [type(e).__name__ for c in commits for e in c.events] == ["InvocationStarted"] * 3
    rows = [row for commit in commits for row in commit.rows]
    assert [row.invocation_id for row in rows] == [goal.invocation_id for goal in result]
    assert {(row.agent_name, row.agent_ref, row.status) for row in rows} == {
        ("planner", "plans:agent", QueueStatus.RUNNABLE)
    }
    assert [done.done for done in seen if isinstance(done, ChunkDone)] == [2, 3]
    assert {goal.status for goal in result} == {SubmittedStatus.SUBMITTED}


def test_a_goal_already_submitted_is_not_committed_again_and_its_row_is_added() -> None:
    plan = requests(Submission("a", invocation_id="a1"), Submission("b", invocation_id="b1"))
    seen, result = walk(plan, store_answers({"a1": started(plan[0])}))
    [commit] = [step for step in seen if isinstance(step, CommitStarts)]
    assert [event.originator_id for event in commit.events] == ["b1"]
    [again] = [step for step in seen if isinstance(step, AddRows)]
    assert [(row.invocation_id, row.status) for row in again.rows] == [("a1", QueueStatus.RUNNABLE)]
    assert [(goal.invocation_id, goal.status) for goal in result] == [
        ("a1", SubmittedStatus.ALREADY_SUBMITTED),
        ("b1", SubmittedStatus.SUBMITTED),
    ]


def test_an_id_of_another_goal_stops_the_submission_before_anything_is_committed() -> None:
    plan = requests("first", Submission("pay", invocation_id="x"), "third")
    seen: list[SubmissionStep] = []

    def answer(step: SubmissionStep) -> Any:
        seen.append(step)
        return store_answers({"x": started(plan[1], goal="refund")})(step)

    with pytest.raises(SubmissionError) as refused:
        walk(plan, answer)
    assert (refused.value.problem, refused.value.index, refused.value.where) == (
        SubmissionProblem.ID_TAKEN,
        1,
        "goals[1]",
    )
    assert "'refund'" in str(refused.value)
    assert not any(isinstance(step, CommitStarts) for step in seen)


def test_an_id_taken_by_another_goal_meanwhile_stops_at_its_chunk_saying_how_far_it_got() -> None:
    plan = requests("a", "b", Submission("c", invocation_id="c1"), "d")
    found: dict[str, Invocation] = {}
    inner = store_answers(found, commits=[True, False])

    def answer(step: SubmissionStep) -> Any:
        if isinstance(step, CommitStarts) and "c1" in {e.originator_id for e in step.events}:
            found["c1"] = started(plan[2], goal="another")  # another process, just before
        return inner(step)

    with pytest.raises(SubmissionError) as refused:
        walk(plan, answer)
    assert (refused.value.problem, refused.value.index) == (SubmissionProblem.ID_TAKEN, 2)
    assert "2 of 4 goals were submitted, from goals[2] on none was" in str(refused.value)


def test_an_id_taken_by_the_same_goal_meanwhile_is_left_out_and_the_chunk_committed_again() -> None:
    plan = requests(Submission("c", invocation_id="c1"), "d")
    found: dict[str, Invocation] = {}
    inner = store_answers(found, commits=[False, True])

    def answer(step: SubmissionStep) -> Any:
        if isinstance(step, CommitStarts) and not found:
            found["c1"] = started(plan[0])  # the same submission, run by another process
        return inner(step)

    seen, result = walk(plan, answer)
    commits = [step for step in seen if isinstance(step, CommitStarts)]
    assert [len(commit.events) for commit in commits] == [2, 1]
    assert [goal.status for goal in result] == [
        SubmittedStatus.ALREADY_SUBMITTED,
        SubmittedStatus.SUBMITTED,
    ]


def test_a_conflict_with_no_id_taken_is_an_error_not_a_loop() -> None:
    with pytest.raises(StoreUnavailableError, match="none of its ids was taken"):
        walk(requests("a", "b"), store_answers(commits=[False, False]))


def test_a_commit_that_fails_says_how_many_goals_were_submitted() -> None:
    commits = 0

    def answer(step: SubmissionStep) -> Any:
        nonlocal commits
        if isinstance(step, CommitStarts):
            commits += 1
            if commits == 2:
                raise StoreUnavailableError("the disk is full")
        return store_answers()(step)

    with pytest.raises(StoreUnavailableError) as failed:
        walk(requests("a", "b", "c", "d", "e"), answer)
    assert str(failed.value).startswith("the disk is full; 2 of 5 goals were submitted, from ")
    assert "goals[2] on none was" in str(failed.value)


def test_a_chunk_size_below_1_is_refused() -> None:
    with pytest.raises(UsageError, match="at least 1"):
        walk(requests("a"), store_answers(), chunk_size=0)


@pytest.mark.parametrize(
    ("goals", "problem", "index"),
    [
        (["a", ""], SubmissionProblem.MISSING_GOAL, 1),
        (["a", Submission("   ")], SubmissionProblem.MISSING_GOAL, 1),
        ([42], SubmissionProblem.INVALID_VALUE, 0),
        ([Submission("a", invocation_id="eff-1")], SubmissionProblem.INVALID_VALUE, 0),
        (["a", Submission("b\ud800")], SubmissionProblem.INVALID_VALUE, 1),
        (
            [Submission("a", invocation_id="x"), "b", Submission("c", invocation_id="x")],
            SubmissionProblem.DUPLICATE_ID,
            2,
        ),
    ],
)
def test_a_bad_goal_is_refused_with_its_place_before_anything_is_asked(
    goals: list[Any], problem: SubmissionProblem, index: int
) -> None:
    with pytest.raises(SubmissionError) as refused:
        submission_requests(AGENT, goals)
    assert (refused.value.problem, refused.value.index) == (problem, index)
    assert str(refused.value).startswith(f"goals[{index}]: ")
