"""The Invocation aggregate refuses every illegal transition, and nothing happens when it does."""

from __future__ import annotations

from typing import Any

import pytest
from eventsourcing.domain import OriginatorVersionError
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates import (
    Budget,
    Clarification,
    DispatchedCall,
    Final,
    IllegalTransitionError,
    Invocation,
    Phase,
    Rejection,
    RejectionClass,
    TerminalReason,
    ToolCall,
    ToolCalls,
    ToolEffect,
    ToolResult,
    Usage,
)
from aggregates.children import Allotment, Spent
from aggregates.critic import Verdict
from aggregates.decisions import Plan
from aggregates.invocation import (
    EVENT_TYPES,
    TRANSITIONS,
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    BudgetReserved,
    BudgetReturned,
    ClarificationProvided,
    ContextCompacted,
    CritiqueReturned,
    DecisionProposed,
    InvocationEvent,
    InvocationSnapshot,
    InvocationStarted,
    InvocationState,
    LeaseAcquired,
    Paused,
    PlanProposed,
    ResultsCommitted,
    SettingsChanged,
    SleepEnded,
    Terminated,
    VerificationFailed,
    replay,
)
from aggregates.settings import RunSettings
from tests.support.invocations import (
    AT,
    COMMANDS,
    RICH_COMMANDS,
    apply,
    apply_rich,
    batch,
    dispatched,
    in_phase,
    new,
    ok,
    plan_writes,
)

# --------------------------------------------------------------------------- examples


def test_a_decision_is_refused_while_a_batch_is_dispatched() -> None:
    inv = new()
    decision = batch("c1")
    inv.propose(decision, usage=Usage(), at=AT)
    inv.dispatch(dispatched(decision), [["c1"]], at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.propose(Final(answer="x"), usage=Usage(), at=AT)
    assert inv.phase is Phase.DISPATCHED
    assert inv.version == 3


def test_results_must_cover_every_dispatched_call_exactly_once_in_order() -> None:
    inv = new()
    decision = batch("c1", "c2")
    inv.propose(decision, usage=Usage(), at=AT)
    inv.dispatch(dispatched(decision), [["c1", "c2"]], at=AT)
    for wrong in ([ok("c1")], [ok("c2"), ok("c1")], [ok("c1"), ok("c1")], [ok("c1"), ok("x")]):
        with pytest.raises(IllegalTransitionError):
            inv.commit_results(wrong, at=AT)
    inv.commit_results([ok("c1"), ok("c2")], at=AT)
    assert inv.phase is Phase.READY


def test_nothing_is_accepted_after_terminated() -> None:
    inv = new()
    inv.propose(Final(answer="x"), usage=Usage(), at=AT)
    inv.terminate(TerminalReason.COMPLETED, answer="x", at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.propose(Final(answer="y"), usage=Usage(), at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.terminate(TerminalReason.CANCELLED, at=AT)


def test_completed_needs_the_committed_final_answer() -> None:
    inv = new()
    with pytest.raises(IllegalTransitionError):
        inv.terminate(TerminalReason.COMPLETED, answer="made up", at=AT)
    inv.propose(Final(answer="real"), usage=Usage(), at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.terminate(TerminalReason.COMPLETED, answer="other", at=AT)


def test_duplicate_call_ids_and_empty_batches_are_not_decisions() -> None:
    inv = new()
    with pytest.raises(IllegalTransitionError):
        inv.propose(batch("c1", "c1"), usage=Usage(), at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.propose(ToolCalls(calls=[]), usage=Usage(), at=AT)
    assert inv.version == 1


def test_dispatch_refuses_to_exceed_the_tool_budget_or_repeat_a_plan() -> None:
    inv = new(Budget(max_tool_calls=1, max_repeated_plan=1))
    decision = batch("c1", "c2")
    inv.propose(decision, usage=Usage(), at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.dispatch(dispatched(decision), [["c1", "c2"]], at=AT)

    inv = new(Budget(max_repeated_plan=1))
    for step in range(2):
        decision = batch(f"c{step}")
        inv.propose(decision, usage=Usage(), at=AT)
        if step == 0:
            inv.dispatch(dispatched(decision), [[f"c{step}"]], at=AT)
            inv.commit_results([ok("c0")], at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.dispatch(dispatched(decision), [["c1"]], at=AT)


def test_a_pausing_reason_cannot_terminate_and_a_final_one_cannot_pause() -> None:
    inv = new()
    inv.propose(Final(answer="x"), usage=Usage(), at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.terminate(TerminalReason.APPROVAL_REQUIRED, at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.pause(TerminalReason.CANCELLED, at=AT)


# --------------------------------------------------------------------------- properties


def snapshot(inv: Invocation) -> Any:
    return (
        inv.version,
        inv.phase,
        inv.step,
        inv.tool_calls,
        len(inv.turns),
        inv.pending_batch,
        inv.terminated,
        inv.repeat_streak,
        len(inv.pending_events),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(COMMANDS), st.integers(0, 5)), max_size=25))
def test_random_command_orders_either_apply_or_change_nothing(
    commands: list[tuple[str, int]],
) -> None:
    inv = new()
    for command, n in commands:
        before = snapshot(inv)
        try:
            apply(inv, command, n)
        except IllegalTransitionError:
            assert snapshot(inv) == before
        else:
            assert inv.version == before[0] + 1
        # Invariants that hold after every accepted or refused command.
        assert inv.tool_calls <= inv.budget.max_tool_calls
        assert inv.step <= inv.budget.max_steps
        assert (inv.phase is Phase.DISPATCHED) == (inv.pending_batch is not None)
        assert [t.step for t in inv.turns] == list(range(1, inv.step + 1))
    # Replaying what was accepted rebuilds the same state.
    events = inv.take_events()
    rebuilt = replay(None, events)
    assert rebuilt is not None
    assert snapshot(rebuilt)[:-1] == snapshot(inv)[:-1]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_shuffled_or_trimmed_history_is_refused_on_replay(data: st.DataObject) -> None:
    inv = new()
    for n in range(3):
        decision = batch(f"c{n}", key=str(n))
        inv.propose(decision, usage=Usage(), at=AT)
        inv.dispatch(dispatched(decision), [[f"c{n}"]], at=AT)
        inv.commit_results([ok(f"c{n}")], at=AT)
    inv.propose(Final(answer="done"), usage=Usage(), at=AT)
    inv.terminate(TerminalReason.COMPLETED, answer="done", at=AT)
    events = inv.take_events()
    order = data.draw(st.permutations(range(len(events))))
    if list(order) == sorted(order):
        return
    reordered = [events[i] for i in order]
    # Our transition check, eventsourcing's version check, or its "created first" assert.
    with pytest.raises((IllegalTransitionError, OriginatorVersionError, AssertionError)):
        replay(None, reordered)


# --------------------------------------------------------------------------- the table


def _fire(inv: Invocation, event_type: type[InvocationEvent]) -> None:
    """The most plausible event of ``event_type`` for the invocation's state."""
    decision = inv.last_decision
    paused = inv.paused
    if event_type is InvocationStarted:
        inv.trigger_event(
            InvocationStarted,
            timestamp=AT,
            originator_topic="aggregates.invocation:Invocation",
            goal="again",
            agent_name="a",
            agent_version="1",
            catalogue_digest="d",
            tools=[],
            budget=Budget(),
        )
    elif event_type is DecisionProposed:
        inv.propose(Final(answer="y"), usage=Usage(), at=AT)
    elif event_type is ContextCompacted:
        inv.record_compaction(dropped_steps=[], kept_steps=[], size_before=10, size_after=5, at=AT)
    elif event_type is BatchDispatched:
        calls = decision if isinstance(decision, ToolCalls) else batch("c9")
        inv.dispatch(dispatched(calls), [[c.id for c in calls.calls]], at=AT)
    elif event_type is ResultsCommitted:
        pending = inv.pending_batch
        named = [(c.call_id, c.name) for c in pending.calls] if pending else [("c9", "lookup")]
        inv.commit_results(
            [ToolResult(call_id=i, name=name, output={"v": 1}) for i, name in named], at=AT
        )
    elif event_type is Paused:
        if inv.phase is Phase.READY:
            inv.pause(TerminalReason.RATE_LIMITED, question="no quota", wake_at=AT, at=AT)
        elif inv.phase is Phase.DISPATCHED:
            inv.pause(TerminalReason.RECONCILIATION_REQUIRED, question="?", at=AT)
        elif inv.phase in (Phase.AWAITING_RECONCILIATION, Phase.AWAITING_CHILD):
            # A child of the batch waits for a person (again, or now for another answer).
            inv.pause(
                TerminalReason.CLARIFICATION_REQUIRED,
                question="which?",
                child_path=["child-1", "child-2"],
                at=AT,
            )
        elif isinstance(decision, ToolCalls):
            inv.pause(
                TerminalReason.APPROVAL_REQUIRED,
                proposal_digest="digest",
                calls=dispatched(decision),
                at=AT,
            )
        else:
            inv.pause(TerminalReason.CLARIFICATION_REQUIRED, question="?", at=AT)
    elif event_type is ApprovalGranted:
        digest = paused.proposal_digest if paused and paused.proposal_digest else "digest"
        inv.grant_approval(digest, by="op", at=AT)
    elif event_type is ApprovalDenied:
        digest = paused.proposal_digest if paused and paused.proposal_digest else "digest"
        inv.deny_approval(digest, by="op", reason="no", at=AT)
    elif event_type is ClarificationProvided:
        inv.provide_clarification("this one", at=AT)
    elif event_type is VerificationFailed:
        inv.fail_verification("wrong", at=AT)
    elif event_type is SettingsChanged:
        inv.change_settings(Budget(max_steps=9), RunSettings(), at=AT)
    elif event_type is LeaseAcquired:
        inv.acquire_lease("worker-b", inv.lease_epoch + 1, at=AT)
    elif event_type is Terminated:
        inv.terminate(TerminalReason.CANCELLED, at=AT)
    elif event_type is BudgetReserved:
        pending = inv.pending_batch
        call = pending.calls[0] if pending else None
        child_id = call.child_id if call and call.child_id else "child-9"
        call_id = call.call_id if call else "c9"
        inv.reserve_budget(call_id, child_id, Allotment(steps=1, tool_calls=0), at=AT)
    elif event_type is BudgetReturned:
        reserved = next(iter(inv.reservations.values()), None)
        call_id, child_id = (reserved.call_id, reserved.child_id) if reserved else ("c9", "child-9")
        share = reserved.allotment.reserved if reserved else Spent()
        inv.return_budget(call_id, child_id, Spent(steps=1), share.minus(Spent(steps=1)), at=AT)
    elif event_type is SleepEnded:
        inv.wake(at=AT)
    elif event_type is CritiqueReturned:
        inv.record_critique(Verdict.REVISE, critique="say why", usage=Usage(), at=AT)
    elif event_type is PlanProposed:
        inv.propose_plan(
            plan_writes(decision) if isinstance(decision, Plan) else [], summary="", at=AT
        )
    else:
        raise AssertionError(f"no builder for {event_type.__name__}")


_VARIANTS = {
    Phase.DECIDED: ["final", "question", "plan"],
    Phase.READY: ["", "child"],
    Phase.DISPATCHED: ["", "child", "reserved"],
    Phase.SLEEPING: ["", "batch"],
}
_CELLS = [
    (phase, event_type) for phase in Phase if phase is not Phase.NEW for event_type in EVENT_TYPES
]


@pytest.mark.parametrize(
    ("phase", "event_type"), _CELLS, ids=[f"{p.value}-{e.__name__}" for p, e in _CELLS]
)
def test_each_cell_of_the_transition_table_applies_or_is_refused_with_nothing_changed(
    phase: Phase, event_type: type[InvocationEvent]
) -> None:
    applied = []
    for variant in _VARIANTS.get(phase, [""]):
        inv = in_phase(phase, variant)
        before = snapshot(inv)
        try:
            _fire(inv, event_type)
        except IllegalTransitionError:
            assert snapshot(inv) == before
            applied.append(False)
        else:
            assert inv.version == before[0] + 1
            assert inv.phase in TRANSITIONS[phase][event_type], (
                f"{event_type.__name__} led {phase.value} to {inv.phase.value}, "
                "not where the table says"
            )
            applied.append(True)
    if event_type in TRANSITIONS[phase]:
        assert any(applied), f"{event_type.__name__} is in the {phase.value} row but never applied"
    else:
        assert not any(applied), f"{event_type.__name__} applied outside the table"


def test_the_table_names_every_phase_and_only_known_events() -> None:
    assert set(TRANSITIONS) == set(Phase)
    assert all(set(row) <= set(EVENT_TYPES) for row in TRANSITIONS.values())
    assert not TRANSITIONS[Phase.TERMINATED]
    assert all(destinations for row in TRANSITIONS.values() for destinations in row.values())


def test_terminated_is_refused_while_a_batch_waits_for_reconciliation() -> None:
    inv = in_phase(Phase.AWAITING_RECONCILIATION)
    with pytest.raises(IllegalTransitionError):
        inv.terminate(TerminalReason.CANCELLED, at=AT)
    # The batch ends with its results first; then the invocation may stop.
    inv.commit_results([ok("c1")], at=AT)
    inv.terminate(TerminalReason.CANCELLED, at=AT)
    assert inv.phase is Phase.TERMINATED


def test_a_repeated_plan_is_judged_on_the_dispatched_normalised_arguments() -> None:
    inv = new(Budget(max_repeated_plan=1))
    first = ToolCalls(calls=[ToolCall(id="c1", name="lookup", arguments={"q": "x"})])
    inv.propose(first, usage=Usage(), at=AT)
    normalised = [
        DispatchedCall(
            call_id="c1", name="lookup", arguments={"q": "x", "limit": 10}, effect=ToolEffect.READ
        )
    ]
    inv.dispatch(normalised, [["c1"]], at=AT)
    inv.commit_results([ok("c1")], at=AT)
    second = ToolCalls(calls=[ToolCall(id="c2", name="lookup", arguments={"q": "x", "limit": 10})])
    inv.propose(second, usage=Usage(), at=AT)
    again = [normalised[0].model_copy(update={"call_id": "c2"})]
    assert inv.repeat_streak_after(again) == 2
    with pytest.raises(IllegalTransitionError, match="max_repeated_plan"):
        inv.dispatch(again, [["c2"]], at=AT)


def test_a_snapshot_taken_before_the_pauses_were_named_still_loads() -> None:
    inv = in_phase(Phase.AWAITING_CLARIFICATION)
    state = InvocationSnapshot.take(inv).state.model_dump(mode="json")
    state["phase"] = "paused"  # as snapshots of earlier versions say
    restored = InvocationState.model_validate(state)
    assert restored.phase is Phase.AWAITING_CLARIFICATION


# --------------------------------------------------------------------------- every kind of pause


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(RICH_COMMANDS), st.integers(0, 5)), max_size=30))
def test_random_orders_of_every_kind_of_event_apply_or_change_nothing(
    commands: list[tuple[str, int]],
) -> None:
    inv = new()
    for command, n in commands:
        before = snapshot(inv)
        try:
            apply_rich(inv, command, n)
        except IllegalTransitionError:
            assert snapshot(inv) == before
        else:
            assert inv.version == before[0] + 1
        running = inv.phase in (Phase.DISPATCHED, Phase.AWAITING_RECONCILIATION)
        assert running == (inv.pending_batch is not None)
        assert inv.phase.paused == (inv.paused is not None)
        assert inv.tool_calls <= inv.budget.max_tool_calls
        assert [t.step for t in inv.turns] == list(range(1, inv.step + 1))
        if inv.phase is Phase.TERMINATED:
            assert inv.pending_batch is None
    rebuilt = replay(None, inv.take_events())
    assert rebuilt is not None
    assert snapshot(rebuilt)[:-1] == snapshot(inv)[:-1]
    assert rebuilt.phase is inv.phase


def test_a_lease_epoch_that_does_not_grow_is_refused_and_changes_nothing() -> None:
    inv = in_phase(Phase.DISPATCHED)
    inv.acquire_lease("worker-a", 3, at=AT)
    before = snapshot(inv)
    for stale in (3, 2, 0, -1):  # the same epoch again, older ones, nonsense
        with pytest.raises(IllegalTransitionError):
            inv.acquire_lease("worker-b", stale, at=AT)
        assert snapshot(inv) == before
    with pytest.raises(IllegalTransitionError):
        inv.acquire_lease("", 4, at=AT)  # no worker id
    inv.acquire_lease("worker-b", 4, at=AT, taken_from="worker-a")
    assert (inv.lease_holder, inv.lease_epoch, inv.phase) == ("worker-b", 4, Phase.DISPATCHED)


def test_a_lease_survives_a_snapshot() -> None:
    inv = in_phase(Phase.READY)
    inv.acquire_lease("worker-a", 2, at=AT)
    restored = InvocationSnapshot.take(inv).mutate(None)
    assert (restored.lease_holder, restored.lease_epoch) == ("worker-a", 2)


@pytest.mark.parametrize(
    "propose",
    ["final", "question", "batch", "rejection"],
)
def test_every_kind_of_decision_leads_where_the_table_says(propose: str) -> None:
    """A rejected proposal too: it leads back to ``ready`` (the model is asked again)."""
    inv = in_phase(Phase.READY)
    match propose:
        case "final":
            inv.propose(Final(answer="x"), usage=Usage(), at=AT)
        case "question":
            inv.propose(Clarification(question="which?"), usage=Usage(), at=AT)
        case "batch":
            inv.propose(batch("c7"), usage=Usage(), at=AT)
        case _:
            rejection = Rejection(
                rejection_class=RejectionClass.SCHEMA_INVALID, problems=["no"], raw="x"
            )
            inv.reject(rejection, usage=Usage(), at=AT)
    assert inv.phase in TRANSITIONS[Phase.READY][DecisionProposed]
