"""Plan-then-approve in the pure core: the read-only ceiling, the plan, its approval, its writes.

Driven without trio through the test :class:`Shell` over the fake tools (``search`` reads;
``send`` and ``delete`` write, ``delete`` needs approval by its rule).

Bad inputs tried: a plan whose step is malformed (no tool, arguments that are not an
object), one naming an unknown tool, one naming a read tool, one whose arguments the tool
refuses, an empty plan, a plan from an agent that does not plan; an approval with a wrong
digest; a dispatch that runs a write under the ceiling, or names a plan step of another
write, or one already made.
"""

from __future__ import annotations

from typing import Any

import pytest

from aggregates.decisions import (
    Budget,
    ErrorClass,
    Plan,
    RejectionClass,
    TerminalReason,
    ToolCall,
    ToolCalls,
    ToolEffect,
    Usage,
)
from aggregates.errors import IllegalTransitionError
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    DecisionProposed,
    DispatchedCall,
    InvocationSnapshot,
    Paused,
    Phase,
    PlanProposed,
)
from aggregates.planning import ApproveBy, Planning, PlanStage, write_digest
from aggregates.settings import RunSettings
from aggregates.standing import ApprovalRefusal, approval_refusal
from aggregates.turn import AskModel, Authorise, Finished, PolicyVerdict, RunCalls
from tests.support.replies import calls
from tests.support.turn_core import Shell, call_of, ok, replayed_invocation, types

PLANS = RunSettings(planning=Planning())


def plan(*steps: tuple[str, dict[str, Any]], summary: str = "tell bob") -> dict[str, Any]:
    return {
        "kind": "plan",
        "steps": [{"tool": tool, "arguments": arguments} for tool, arguments in steps],
        "summary": summary,
    }


BOB = ("send", {"to": "bob"})


def planning(settings: RunSettings = PLANS, *, authorises: bool = False) -> Shell:
    # The same call may be proposed again (as a write of the plan, then outside it).
    budget = Budget(max_repeated_plan=3)
    shell = Shell.over(settings=settings, authorises=authorises, budget=budget)
    shell.begin()
    return shell


def proposed_plan(*steps: tuple[str, dict[str, Any]]) -> Shell:
    shell = planning()
    shell.answer(plan(*(steps or (BOB,))))
    return shell


def approved(*steps: tuple[str, dict[str, Any]]) -> Shell:
    shell = proposed_plan(*steps)
    digest = shell.paused.proposal_digest
    assert digest is not None
    shell.invocation.grant_approval(digest, by="alice", at=shell.now.at)
    shell.resume()
    return shell


# --------------------------------------------------------------------------- the ceiling


def test_a_run_that_plans_offers_read_tools_only_and_tells_the_model_to_plan() -> None:
    ask = planning().expect(AskModel)
    assert ask.read_only
    assert any(notice.startswith("You are planning") for notice in ask.notices)


def test_a_run_that_does_not_plan_has_no_ceiling() -> None:
    ask = Shell.over().begin()
    assert isinstance(ask, AskModel)
    assert not ask.read_only
    assert ask.notices == []


def test_a_write_proposed_while_planning_is_refused_with_a_denied_result_the_model_sees() -> None:
    shell = planning()
    run = shell.answer(calls(("c1", "search", {"q": "x"}), ("c2", "send", {"to": "bob"})))
    assert isinstance(run, RunCalls)
    assert [c.call_id for c in run.calls] == ["c1"]  # the write never reaches a tool
    action = shell.ran(ok(call_of(run, "c1")))
    assert isinstance(action, AskModel)
    result = shell.invocation.turns[-1].results[1]
    assert result.error is not None
    assert result.error.error_class is ErrorClass.DENIED
    assert "no plan is approved yet" in result.error.message
    dispatched = shell.invocation.turns[-1]
    assert dispatched.results[1].effect_key is None  # no ledger entry: it never ran


def test_the_record_refuses_a_write_dispatched_under_the_ceiling() -> None:
    shell = planning()
    inv = shell.invocation
    inv.propose(_tool_calls("c1", "send", {"to": "bob"}), usage=Usage(), at=shell.now.at)
    write = DispatchedCall(
        call_id="c1", name="send", arguments={"to": "bob", "body": ""}, effect=ToolEffect.WRITE
    )
    with pytest.raises(IllegalTransitionError, match="before a plan is approved"):
        inv.dispatch([write], [["c1"]], at=shell.now.at)


# --------------------------------------------------------------------------- the plan


def test_a_plan_is_recorded_with_its_validated_writes_and_pauses_for_a_person() -> None:
    shell = proposed_plan(BOB)
    assert types(shell.committed)[-3:] == ["DecisionProposed", "PlanProposed", "Paused"]
    recorded = shell.of_type(PlanProposed)[0]
    # Stored as it is matched: validated, the tool's defaults filled in.
    assert [(w.tool, w.arguments) for w in recorded.writes] == [("send", {"to": "bob", "body": ""})]
    assert recorded.writes[0].arguments_digest == write_digest("send", {"to": "bob", "body": ""})
    assert recorded.supersedes is None
    paused = shell.paused
    assert paused.reason is TerminalReason.PLAN_APPROVAL_REQUIRED
    assert paused.proposal_digest == recorded.digest
    assert shell.invocation.phase is Phase.AWAITING_APPROVAL
    decision = shell.of_type(DecisionProposed)[-1].decision
    assert isinstance(decision, Plan)
    assert decision.steps[0].arguments == {"to": "bob", "body": ""}


def test_a_plan_and_its_approval_read_back_from_the_record_and_a_snapshot() -> None:
    shell = approved(BOB)
    rebuilt = replayed_invocation(shell.committed)
    assert rebuilt.planning == shell.invocation.planning
    assert rebuilt.planning is not None
    assert rebuilt.planning.stage is PlanStage.APPROVED
    assert rebuilt.planning.approved_by == "alice"
    snapshot = InvocationSnapshot.take(rebuilt)
    restored = InvocationSnapshot.model_validate_json(snapshot.model_dump_json()).mutate(None)
    assert restored.planning == rebuilt.planning


def test_approving_a_plan_with_a_wrong_digest_is_refused() -> None:
    shell = proposed_plan(BOB)
    inv = shell.invocation
    assert approval_refusal(inv, "0" * 64) is ApprovalRefusal.OTHER_DIGEST
    with pytest.raises(IllegalTransitionError, match="digest"):
        inv.grant_approval("0" * 64, by="mallory", at=shell.now.at)
    assert inv.phase is Phase.AWAITING_APPROVAL


# --------------------------------------------------------------------------- the approved plan


def test_an_approved_plan_lifts_the_ceiling_and_runs_its_write_without_a_pause() -> None:
    shell = approved(BOB)
    assert not shell.expect(AskModel).read_only
    assert shell.expect(AskModel).notices == []
    assert shell.invocation.turns[-1].approval == "approved by alice"
    run = shell.answer(calls(("c1", "send", {"to": "bob"})))
    assert isinstance(run, RunCalls)  # no pause: the plan authorised it
    assert call_of(run, "c1").plan_step == 1


def test_a_planned_write_runs_even_when_its_tool_would_need_approval() -> None:
    shell = approved(("delete", {"path": "reports/old.csv"}))
    run = shell.answer(calls(("c1", "delete", {"path": "reports/old.csv"})))
    assert isinstance(run, RunCalls)
    assert call_of(run, "c1").plan_step == 1


def test_a_write_outside_the_plan_pauses_approval_required() -> None:
    shell = approved(BOB)
    action = shell.answer(calls(("c1", "send", {"to": "carol"})))
    assert isinstance(action, Finished)
    paused = shell.paused
    assert paused.reason is TerminalReason.APPROVAL_REQUIRED
    assert paused.needs_approval == ["c1"]


def test_a_write_of_the_plan_with_other_arguments_needs_its_own_approval() -> None:
    shell = approved(BOB)
    shell.answer(calls(("c1", "send", {"to": "bob", "body": "hi"})))
    assert shell.paused.reason is TerminalReason.APPROVAL_REQUIRED


def test_each_planned_write_is_authorised_once() -> None:
    shell = approved(BOB)
    shell.answer(calls(("c1", "send", {"to": "bob"}), ("c2", "send", {"to": "bob"})))
    paused = shell.paused
    assert paused.reason is TerminalReason.APPROVAL_REQUIRED
    assert paused.needs_approval == ["c2"]
    assert [c.plan_step for c in paused.calls or []] == [1, None]


def test_a_planned_write_made_once_needs_approval_the_second_time() -> None:
    shell = approved(BOB)
    run = shell.answer(calls(("c1", "send", {"to": "bob"})))
    assert isinstance(run, RunCalls)
    shell.ran(ok(call_of(run, "c1")))
    assert shell.invocation.planning is not None
    assert shell.invocation.planning.used == [1]
    shell.answer(calls(("c2", "send", {"to": "bob"})))
    assert shell.paused.reason is TerminalReason.APPROVAL_REQUIRED


def test_a_write_outside_the_plan_runs_once_a_person_approved_it() -> None:
    shell = approved(BOB)
    shell.answer(calls(("c1", "send", {"to": "bob"}), ("c2", "send", {"to": "carol"})))
    paused = shell.paused
    assert paused.proposal_digest is not None
    shell.invocation.grant_approval(paused.proposal_digest, by="alice", at=shell.now.at)
    run = shell.resume()
    assert isinstance(run, RunCalls)
    assert [(c.call_id, c.plan_step) for c in run.calls] == [("c1", 1), ("c2", None)]


def test_a_denied_write_outside_the_plan_does_not_run_and_the_plan_step_stays_made() -> None:
    shell = approved(BOB)
    shell.answer(calls(("c1", "send", {"to": "bob"}), ("c2", "send", {"to": "carol"})))
    shell.invocation.deny_approval(
        shell.paused.proposal_digest or "", by="bob", reason="no", at=shell.now.at
    )
    run = shell.resume()
    assert isinstance(run, RunCalls)
    assert [c.call_id for c in run.calls] == ["c1"]


def test_the_record_refuses_a_dispatch_that_names_a_plan_step_of_another_write() -> None:
    shell = approved(BOB)
    inv = shell.invocation
    inv.propose(_tool_calls("c1", "send", {"to": "carol"}), usage=Usage(), at=shell.now.at)
    forged = DispatchedCall(
        call_id="c1",
        name="send",
        arguments={"to": "carol", "body": ""},
        effect=ToolEffect.WRITE,
        plan_step=1,
    )
    with pytest.raises(IllegalTransitionError, match="another write"):
        inv.dispatch([forged], [["c1"]], at=shell.now.at)
    unplanned = forged.model_copy(update={"plan_step": None})
    with pytest.raises(IllegalTransitionError, match="once a person approved it"):
        inv.dispatch([unplanned], [["c1"]], at=shell.now.at)


# --------------------------------------------------------------------------- revisions and denials


def test_a_revised_plan_supersedes_the_last() -> None:
    shell = approved(BOB)
    first = shell.of_type(PlanProposed)[0]
    shell.answer(plan(("send", {"to": "carol"}), summary="tell carol instead"))
    revised = shell.of_type(PlanProposed)[-1]
    assert revised.supersedes == first.digest
    assert revised.digest != first.digest
    assert shell.paused.reason is TerminalReason.PLAN_APPROVAL_REQUIRED
    shell.invocation.grant_approval(revised.digest, by="alice", at=shell.now.at)
    shell.resume()
    shell.answer(calls(("c1", "send", {"to": "bob"})))  # the superseded plan's write
    assert shell.of_type(Paused)[-1].reason is TerminalReason.APPROVAL_REQUIRED


def test_a_revised_plan_brings_the_ceiling_back_until_it_is_approved() -> None:
    shell = approved(BOB)
    shell.answer(plan(("send", {"to": "carol"})))
    state = shell.invocation.planning
    assert state is not None
    assert state.stage is PlanStage.PROPOSED
    assert state.read_only


def test_a_denied_plan_goes_back_to_the_model_with_the_denial_as_notice() -> None:
    shell = proposed_plan(BOB)
    shell.invocation.deny_approval(
        shell.paused.proposal_digest or "", by="bob", reason="too risky", at=shell.now.at
    )
    ask = shell.resume()
    assert isinstance(ask, AskModel)
    assert ask.read_only
    assert "Your last plan was denied by bob: too risky. Propose a revised plan, or stop." in (
        ask.notices
    )
    assert shell.invocation.turns[-1].approval == "denied by bob: too risky"
    # Still planning: a write is refused.
    run = shell.answer(calls(("c1", "send", {"to": "bob"})))
    assert not isinstance(run, RunCalls)
    assert shell.invocation.turns[-1].results[0].error is not None


# --------------------------------------------------------------------------- the policy


def test_a_policy_approves_a_plan_only_when_the_agent_says_so() -> None:
    by_policy = RunSettings(planning=Planning(approve_by=ApproveBy.POLICY))
    shell = planning(by_policy, authorises=True)
    review = shell.answer(plan(BOB))
    assert isinstance(review, Authorise)
    assert [(c.call_id, c.name) for c in review.calls] == [("plan-1", "send")]
    ask = shell.feed(PolicyVerdict())
    assert isinstance(ask, AskModel)
    assert not ask.read_only
    granted = shell.of_type(ApprovalGranted)
    assert [g.by for g in granted] == ["policy"]


def test_a_policy_that_refuses_a_planned_write_denies_the_plan() -> None:
    by_policy = RunSettings(planning=Planning(approve_by=ApproveBy.POLICY))
    shell = planning(by_policy, authorises=True)
    shell.answer(plan(BOB))
    ask = shell.feed(PolicyVerdict(refused={"plan-1": "bob is not a customer"}))
    assert isinstance(ask, AskModel)
    assert ask.read_only
    denied = shell.of_type(ApprovalDenied)
    assert [(d.by, d.reason) for d in denied] == [("policy", "plan-1: bob is not a customer")]


def test_a_policy_does_not_approve_a_plan_of_an_agent_that_wants_a_person() -> None:
    shell = planning(PLANS, authorises=True)
    action = shell.answer(plan(BOB))
    assert isinstance(action, Finished)
    assert shell.paused.reason is TerminalReason.PLAN_APPROVAL_REQUIRED


# --------------------------------------------------------------------------- bad plans


@pytest.mark.parametrize(
    ("proposal", "rejection_class", "problem"),
    [
        (
            {"kind": "plan", "steps": [{"arguments": {"to": "bob"}}]},
            RejectionClass.SCHEMA_INVALID,
            "tool",
        ),
        (
            {"kind": "plan", "steps": [{"tool": "send", "arguments": [1, 2]}]},
            RejectionClass.SCHEMA_INVALID,
            "arguments",
        ),
        (plan(("wire", {"to": "bob"})), RejectionClass.UNKNOWN_TOOL, "unknown tool 'wire'"),
        (plan(("search", {"q": "x"})), RejectionClass.INVALID_PLAN, "search reads"),
        (plan(("send", {"too": "bob"})), RejectionClass.INVALID_ARGUMENTS, "arguments for send"),
        (plan(), RejectionClass.INVALID_PLAN, "at least one write"),
    ],
    ids=["no-tool", "arguments-not-object", "unknown-tool", "a-read", "bad-arguments", "empty"],
)
def test_a_malformed_plan_is_rejected_and_the_model_is_told(
    proposal: dict[str, Any], rejection_class: RejectionClass, problem: str
) -> None:
    shell = planning()
    action = shell.answer(proposal)
    assert isinstance(action, AskModel)  # asked again, told what was wrong
    rejection = shell.of_type(DecisionProposed)[-1].rejection
    assert rejection is not None
    assert rejection.rejection_class is rejection_class
    assert any(problem in p for p in rejection.problems), rejection.problems
    assert shell.of_type(PlanProposed) == []
    assert shell.of_type(Paused) == []


def test_a_plan_from_an_agent_that_does_not_plan_is_rejected() -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer(plan(BOB))
    rejection = shell.of_type(DecisionProposed)[-1].rejection
    assert rejection is not None
    assert rejection.rejection_class is RejectionClass.INVALID_PLAN
    assert "does not plan" in rejection.problems[0]


# --------------------------------------------------------------------------- helpers


def _tool_calls(call_id: str, name: str, arguments: dict[str, Any]) -> ToolCalls:
    return ToolCalls(calls=[ToolCall(id=call_id, name=name, arguments=arguments)])
