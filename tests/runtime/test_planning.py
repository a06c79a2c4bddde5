"""Plan-then-approve through the Runtime: a scripted model, real tools, a SQLite file.

Each resume is a new ``Runtime`` over the same file, as a new process would open it.

Bad inputs tried: approving a plan with a wrong digest; an agent that wants a policy
to approve its plans but has none; a ``Planning`` with an unknown approver.
"""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
import trio

from aggregates.invocation import ApprovalDenied, ApprovalGranted, PlanProposed
from aggregates.planning import PlanStage
from loop_actors import (
    AccessRequest,
    Agent,
    ApprovalRefusedError,
    Budget,
    Deny,
    ErrorClass,
    ModelRequest,
    Planning,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    UsageError,
    tool,
)
from tests.support.replies import calls, final

PLAN: dict[str, Any] = {
    "kind": "plan",
    "summary": "refund order A-1",
    "steps": [
        {
            "tool": "refund",
            "arguments": {"order_id": "A-1", "amount": 250},
            "description": "refund the broken kettle",
        }
    ],
}


class Ledger:
    """What really ran, and what the model was shown."""

    def __init__(self) -> None:
        self.refunds: list[tuple[str, int]] = []
        self.requests: list[ModelRequest] = []


def shop_agent(ledger: Ledger, script: list[Any], **options: Any) -> Agent:
    @tool
    async def look_up(order_id: str) -> dict[str, Any]:
        """Read an order."""
        return {"order_id": order_id, "paid": 250}

    @tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"))
    async def refund(order_id: str, amount: int) -> dict[str, Any]:
        """Refund an order."""
        ledger.refunds.append((order_id, amount))
        return {"refunded": amount, "order_id": order_id}

    def decide(request: ModelRequest) -> Any:
        ledger.requests.append(request)
        return script[request.step - 1]

    options.setdefault("planning", Planning(approve_by="person"))
    return Agent(
        "shop",
        ScriptedModel(decide),
        [look_up, refund],
        Budget(max_repeated_plan=3),
        **options,
    )


async def test_a_run_that_plans_sees_only_read_tools_and_pauses_for_its_plan(db_url: str) -> None:
    ledger = Ledger()
    agent = shop_agent(ledger, [calls(("c1", "look_up", {"order_id": "A-1"})), PLAN])
    outcome = await Runtime(db_url).run(agent, "refund A-1", invocation_id="p1")
    assert outcome.reason is TerminalReason.PLAN_APPROVAL_REQUIRED
    assert outcome.exit_code == 3
    assert [t.name for t in ledger.requests[0].tools] == ["look_up"]
    assert ledger.requests[0].notices[0].startswith("You are planning")
    assert outcome.plan == [
        {
            "step": 1,
            "tool": "refund",
            "arguments": {"order_id": "A-1", "amount": 250},
            "description": "refund the broken kettle",
        }
    ]
    proposed = [e for e in await Runtime(db_url).history("p1") if isinstance(e, PlanProposed)]
    assert outcome.digest == proposed[0].digest


async def test_a_write_proposed_while_planning_is_refused_and_the_model_is_told(
    db_url: str,
) -> None:
    ledger = Ledger()
    refund = calls(("c1", "refund", {"order_id": "A-1", "amount": 250}))
    agent = shop_agent(ledger, [refund, PLAN])
    await Runtime(db_url).run(agent, "refund A-1", invocation_id="p2")
    assert ledger.refunds == []
    [result] = ledger.requests[1].results
    assert result.error is not None
    assert result.error.error_class is ErrorClass.DENIED


async def test_an_approved_plan_runs_its_write_once_and_a_write_outside_it_pauses(
    db_url: str,
) -> None:
    ledger = Ledger()
    script = [
        PLAN,
        calls(("c1", "refund", {"order_id": "A-1", "amount": 250})),
        calls(("c2", "refund", {"order_id": "A-2", "amount": 40})),
        final("refunded A-1 and A-2"),
    ]
    agent = shop_agent(ledger, script)
    paused = await Runtime(db_url).run(agent, "refund A-1", invocation_id="p3")
    assert paused.digest is not None
    await Runtime(db_url).approve("p3", digest=paused.digest, by="alice")
    outside = await Runtime(db_url).resume("p3", agent)
    assert ledger.refunds == [("A-1", 250)]  # in the plan: no other approval
    assert [t.name for t in ledger.requests[1].tools] == ["look_up", "refund"]
    assert outside.reason is TerminalReason.APPROVAL_REQUIRED
    assert outside.pending_calls is not None
    assert [(c["call_id"], c["needs_approval"]) for c in outside.pending_calls] == [("c2", True)]
    assert outside.digest is not None
    await Runtime(db_url).approve("p3", digest=outside.digest, by="alice")
    done = await Runtime(db_url).resume("p3", agent)
    assert done.reason is TerminalReason.COMPLETED
    assert ledger.refunds == [("A-1", 250), ("A-2", 40)]


async def test_approving_a_plan_with_a_wrong_digest_is_refused(db_url: str) -> None:
    ledger = Ledger()
    agent = shop_agent(ledger, [PLAN])
    await Runtime(db_url).run(agent, "refund A-1", invocation_id="p4")
    with pytest.raises(ApprovalRefusedError, match="is not the digest"):
        await Runtime(db_url).approve("p4", digest="0" * 64, by="mallory")
    events = await Runtime(db_url).history("p4")
    assert not any(isinstance(e, ApprovalGranted) for e in events)


async def test_a_denied_plan_goes_back_to_the_model_which_proposes_a_revised_one(
    db_url: str,
) -> None:
    ledger = Ledger()
    step = {**PLAN["steps"][0], "arguments": {"order_id": "A-1", "amount": 200}}
    revised = {**PLAN, "steps": [step]}
    agent = shop_agent(ledger, [PLAN, revised])
    first = await Runtime(db_url).run(agent, "refund A-1", invocation_id="p5")
    await Runtime(db_url).deny("p5", by="bob", reason="refund 200 at most")
    second = await Runtime(db_url).resume("p5", agent)
    assert second.reason is TerminalReason.PLAN_APPROVAL_REQUIRED
    assert second.digest != first.digest
    notice = ledger.requests[1].notices[1]
    assert notice.startswith("Your last plan was denied by bob: refund 200 at most.")
    assert ledger.requests[1].turns[-1].approval == "denied by bob: refund 200 at most"
    events = await Runtime(db_url).history("p5")
    plans = [e for e in events if isinstance(e, PlanProposed)]
    assert [p.supersedes for p in plans] == [None, first.digest]
    assert [e.reason for e in events if isinstance(e, ApprovalDenied)] == ["refund 200 at most"]


async def test_a_policy_approves_the_plan_when_the_agent_says_so(db_url: str) -> None:
    ledger = Ledger()
    asked: list[AccessRequest] = []

    def policy(request: AccessRequest) -> bool | Deny:
        asked.append(request)
        return True

    script = [PLAN, calls(("c1", "refund", {"order_id": "A-1", "amount": 250})), final("ok")]
    agent = shop_agent(ledger, script, planning=Planning(approve_by="policy"), policy=policy)
    outcome = await Runtime(db_url).run(agent, "refund A-1", invocation_id="p6")
    assert outcome.reason is TerminalReason.COMPLETED
    assert ledger.refunds == [("A-1", 250)]
    assert asked[0].tool == "refund"
    assert asked[0].arguments == {"order_id": "A-1", "amount": 250}
    granted = [e for e in await Runtime(db_url).history("p6") if isinstance(e, ApprovalGranted)]
    assert [g.by for g in granted] == ["policy"]


async def test_a_replay_of_a_planned_run_gives_the_plans_approval_again(db_url: str) -> None:
    ledger = Ledger()
    script = [
        PLAN,
        calls(("c1", "refund", {"order_id": "A-1", "amount": 250})),
        final("refunded"),
    ]
    agent = shop_agent(ledger, script)
    paused = await Runtime(db_url).run(agent, "refund A-1", invocation_id="p7")
    assert paused.digest is not None
    await Runtime(db_url).approve("p7", digest=paused.digest, by="alice")
    assert (await Runtime(db_url).resume("p7", agent)).reason is TerminalReason.COMPLETED
    report = await Runtime(db_url).replay(shop_agent(Ledger(), script), ["p7"])
    [result] = report.results
    assert result.identical, result.divergences
    assert ledger.refunds == [("A-1", 250)]  # the replay called no tool


async def test_a_fork_after_the_approval_copies_the_plan_in_force(db_url: str) -> None:
    ledger = Ledger()
    script = [
        PLAN,
        calls(("c1", "refund", {"order_id": "A-1", "amount": 250})),
        final("refunded"),
    ]
    agent = shop_agent(ledger, script)
    paused = await Runtime(db_url).run(agent, "refund A-1", invocation_id="p8")
    assert paused.digest is not None
    await Runtime(db_url).approve("p8", digest=paused.digest, by="alice")
    await Runtime(db_url).resume("p8", agent)
    forked = await Runtime(db_url).fork(
        "p8", at_step=2, by="carol", reason="again", agent=agent, fork_id="p8-fork", run=False
    )
    copy = await Runtime(db_url).load(forked.fork_id)
    assert copy.planning is not None
    assert copy.planning.stage is PlanStage.APPROVED
    assert copy.planning.digest == paused.digest


async def test_a_childs_plan_surfaces_at_the_root_and_is_approved_by_the_roots_id(
    db_url: str,
) -> None:
    ledger = Ledger()
    child = shop_agent(
        ledger,
        [PLAN, calls(("c1", "refund", {"order_id": "A-1", "amount": 250})), final("refunded")],
    )
    delegate = {
        "kind": "tool_calls",
        "calls": [{"id": "d1", "name": "shop", "arguments": {"goal": "refund A-1"}}],
    }
    root = Agent("desk", ScriptedModel([delegate, final("done")]), [child.as_tool()])
    with trio.fail_after(30):
        paused = await Runtime(db_url).run(root, "help the customer", invocation_id="root")
        assert paused.reason is TerminalReason.PLAN_APPROVAL_REQUIRED
        assert paused.path is not None
        assert paused.path[0] == "root"
        assert paused.digest is not None
        assert ledger.refunds == []
        await Runtime(db_url).approve("root", digest=paused.digest, by="alice")
        done = await Runtime(db_url).resume("root", root)
    assert done.reason is TerminalReason.COMPLETED
    assert ledger.refunds == [("A-1", 250)]


def test_an_agent_whose_policy_would_approve_plans_needs_a_policy() -> None:
    with pytest.raises(UsageError, match="needs a policy"):
        shop_agent(Ledger(), [PLAN], planning=Planning(approve_by="policy"))


def test_planning_names_a_known_approver() -> None:
    with pytest.raises(pydantic.ValidationError):
        Planning(approve_by="the intern")
