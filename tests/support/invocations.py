"""Invocations made and driven by their commands, for the tests of the aggregate.

A new one (``new``), one brought to a phase by legal commands (``in_phase``), and the
commands random orders are drawn from (``COMMANDS``, ``RICH_COMMANDS``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from aggregates import (
    Budget,
    Clarification,
    DispatchedCall,
    ErrorClass,
    ErrorInfo,
    Final,
    Invocation,
    Phase,
    TerminalReason,
    ToolCall,
    ToolCalls,
    ToolEffect,
    ToolResult,
    Usage,
    Wait,
)
from aggregates.children import Allotment, child_id_of
from aggregates.decisions import Plan, PlanStep
from aggregates.planning import PlannedWrite, Planning, write_digest
from aggregates.settings import RunSettings

AT = datetime(2026, 1, 1, tzinfo=UTC)


def new(budget: Budget | None = None, *, plans: bool = False) -> Invocation:
    """A new invocation (``plans``: of an agent that plans before it writes)."""
    return Invocation.start(
        invocation_id="inv",
        goal="g",
        agent_name="a",
        agent_version="1",
        catalogue_digest="d",
        tools=[],
        budget=budget or Budget(max_steps=6, max_tool_calls=6, max_repeated_plan=2),
        settings=RunSettings(planning=Planning()) if plans else None,
        at=AT,
    )


PLAN = Plan(steps=[PlanStep(tool="send", arguments={"to": "bob"})], summary="tell bob")
"""A plan of one write."""


def plan_writes(plan: Plan) -> list[PlannedWrite]:
    """The writes a plan records (its arguments as given: no tool normalises them here)."""
    return [
        PlannedWrite(
            tool=s.tool,
            arguments=dict(s.arguments),
            arguments_digest=write_digest(s.tool, s.arguments),
            description=s.description,
        )
        for s in plan.steps
    ]


def batch(*ids: str, key: str = "k") -> ToolCalls:
    return ToolCalls(calls=[ToolCall(id=i, name="lookup", arguments={"key": key}) for i in ids])


def dispatched(decision: ToolCalls) -> list[DispatchedCall]:
    return [
        DispatchedCall(call_id=c.id, name=c.name, arguments=c.arguments, effect=ToolEffect.READ)
        for c in decision.calls
    ]


def child_dispatched(decision: ToolCalls) -> list[DispatchedCall]:
    """Each call dispatched as one that starts a child invocation (a write with a child id)."""
    return [
        DispatchedCall(
            call_id=c.id,
            name=c.name,
            arguments=c.arguments,
            effect=ToolEffect.WRITE,
            effect_key=f"eff-{c.id}",
            child_id=f"child-{c.id[1:]}",
        )
        for c in decision.calls
    ]


def dispatch_write(inv: Invocation) -> str:
    """Dispatch a batch of one write, ``send`` (call ``c1``, key ``eff-c1``); its key."""
    write = ToolCalls(calls=[ToolCall(id="c1", name="send", arguments={"to": "bob"})])
    inv.propose(write, usage=Usage(), at=AT)
    call = DispatchedCall(
        call_id="c1",
        name="send",
        arguments={"to": "bob"},
        effect=ToolEffect.WRITE,
        effect_key="eff-c1",
    )
    inv.dispatch([call], [["c1"]], at=AT)
    return "eff-c1"


def ok(call_id: str) -> ToolResult:
    return ToolResult(call_id=call_id, name="lookup", output={"v": 1})


COMMANDS = ["propose_calls", "propose_final", "dispatch", "results", "terminate", "pause"]


def apply(inv: Invocation, command: str, n: int) -> None:
    """Apply one command, built as plausibly as possible from the current state."""
    decision = inv.last_decision
    match command:
        case "propose_calls":
            inv.propose(batch(f"c{n}", key=str(n % 3)), usage=Usage(), at=AT)
        case "propose_final":
            inv.propose(Final(answer=f"a{n}"), usage=Usage(), at=AT)
        case "dispatch":
            calls = decision.calls if isinstance(decision, ToolCalls) else batch(f"c{n}").calls
            inv.dispatch(dispatched(ToolCalls(calls=calls)), [[c.id for c in calls]], at=AT)
        case "results":
            pending = inv.pending_batch
            ids = [c.call_id for c in pending.calls] if pending else [f"c{n}"]
            inv.commit_results(
                [
                    ToolResult(
                        call_id=i,
                        name="lookup",
                        error=ErrorInfo(
                            error_class=ErrorClass.TIMEOUT, retryable=True, message="slow"
                        ),
                    )
                    for i in ids
                ],
                at=AT,
            )
        case "terminate":
            reasons = [TerminalReason.COMPLETED, TerminalReason.CANCELLED, TerminalReason.MAX_STEPS]
            reason = reasons[n % 3]
            answer = decision.answer if isinstance(decision, Final) else None
            inv.terminate(reason, answer=answer, at=AT)
        case "pause":
            inv.pause(TerminalReason.CLARIFICATION_REQUIRED, question="?", at=AT)


def in_phase(phase: Phase, variant: str = "") -> Invocation:
    """An invocation brought to ``phase`` by legal commands (``variant`` picks a decision)."""
    inv = new()
    decision = batch("c1")
    match phase:
        case Phase.READY if variant == "child":
            # A child's call has its result; its share of the budget is not back yet.
            child = ToolCalls(calls=[ToolCall(id="c1", name="delegate", arguments={"goal": "g"})])
            inv.propose(child, usage=Usage(), at=AT)
            inv.dispatch(child_dispatched(child), [["c1"]], at=AT)
            inv.reserve_budget("c1", "child-1", Allotment(steps=2, tool_calls=2), at=AT)
            inv.commit_results([ToolResult(call_id="c1", name="delegate", output={})], at=AT)
        case Phase.READY:
            pass
        case Phase.CALLS_PROPOSED:
            inv.propose(decision, usage=Usage(), at=AT)
        case Phase.DECIDED if variant == "plan":
            inv = new(plans=True)
            inv.propose(PLAN, usage=Usage(), at=AT)
        case Phase.DECIDED:
            if variant == "final":
                inv.propose(Final(answer="x"), usage=Usage(), at=AT)
            else:
                inv.propose(Clarification(question="which?"), usage=Usage(), at=AT)
        case Phase.DISPATCHED if variant == "child":
            child = ToolCalls(calls=[ToolCall(id="c1", name="delegate", arguments={"goal": "g"})])
            inv.propose(child, usage=Usage(), at=AT)
            inv.dispatch(child_dispatched(child), [["c1"]], at=AT)
        case Phase.DISPATCHED if variant == "reserved":
            # A child from code holds its share while the batch runs (``run_agent``).
            dispatch_write(inv)
            share = Allotment(steps=2, tool_calls=2)
            inv.reserve_budget(
                "c1", child_id_of("eff-c1", "a"), share, at=AT, from_code=True, key="a"
            )
        case Phase.DISPATCHED | Phase.AWAITING_RECONCILIATION:
            inv.propose(decision, usage=Usage(), at=AT)
            inv.dispatch(dispatched(decision), [["c1"]], at=AT)
            if phase is Phase.AWAITING_RECONCILIATION:
                inv.pause(TerminalReason.RECONCILIATION_REQUIRED, question="?", at=AT)
        case Phase.AWAITING_CHILD:
            child = ToolCalls(calls=[ToolCall(id="c1", name="delegate", arguments={"goal": "g"})])
            inv.propose(child, usage=Usage(), at=AT)
            inv.dispatch(child_dispatched(child), [["c1"]], at=AT)
            inv.pause(
                TerminalReason.APPROVAL_REQUIRED,
                proposal_digest="child-digest",
                child_path=["child-1"],
                at=AT,
            )
        case Phase.AWAITING_APPROVAL:
            inv.propose(decision, usage=Usage(), at=AT)
            inv.pause(
                TerminalReason.APPROVAL_REQUIRED,
                proposal_digest="digest",
                calls=dispatched(decision),
                needs_approval=["c1"],
                at=AT,
            )
        case Phase.AWAITING_CLARIFICATION:
            inv.propose(Clarification(question="which?"), usage=Usage(), at=AT)
            inv.pause(TerminalReason.CLARIFICATION_REQUIRED, question="which?", at=AT)
        case Phase.SLEEPING if variant == "batch":
            # A tool of the dispatched batch slept (due at AT).
            inv.propose(decision, usage=Usage(), at=AT)
            inv.dispatch(dispatched(decision), [["c1"]], at=AT)
            inv.pause(TerminalReason.SLEEPING, wake_at=AT, sleeping_calls=["c1"], at=AT)
        case Phase.SLEEPING:
            inv.propose(Wait(reason="later", until=AT), usage=Usage(), at=AT)
            inv.pause(TerminalReason.SLEEPING, question="later", wake_at=AT, at=AT)
        case Phase.TERMINATED:
            inv.propose(Final(answer="x"), usage=Usage(), at=AT)
            inv.terminate(TerminalReason.COMPLETED, answer="x", at=AT)
        case Phase.NEW:
            raise AssertionError("an invocation is created started")
    inv.take_events()
    assert inv.phase is phase
    return inv


RICH_COMMANDS = [
    *COMMANDS,
    "ask_question",
    "pause_approval",
    "approve",
    "deny",
    "clarify",
    "verify_fail",
    "compact",
    "pause_reconciliation",
    "change_settings",
]


def apply_rich(inv: Invocation, command: str, n: int) -> None:
    """Apply one command of the wider set (approvals, questions, verification, ...)."""
    decision = inv.last_decision
    paused = inv.paused
    digest = paused.proposal_digest if paused and paused.proposal_digest else f"d{n}"
    match command:
        case "ask_question":
            inv.propose(Clarification(question=f"q{n}"), usage=Usage(), at=AT)
        case "pause_approval":
            if isinstance(decision, ToolCalls):
                inv.pause(
                    TerminalReason.APPROVAL_REQUIRED,
                    proposal_digest=f"d{n}",
                    calls=dispatched(decision),
                    needs_approval=[decision.calls[0].id],
                    at=AT,
                )
            else:
                inv.pause(TerminalReason.APPROVAL_REQUIRED, proposal_digest=f"d{n}", at=AT)
        case "approve":
            inv.grant_approval(digest, by="op", at=AT)
        case "deny":
            inv.deny_approval(digest, by="op", reason="no", at=AT)
        case "clarify":
            inv.provide_clarification(f"a{n}", at=AT)
        case "verify_fail":
            inv.fail_verification(f"e{n}", at=AT)
        case "compact":
            inv.record_compaction(
                dropped_steps=[], kept_steps=[], size_before=n + 1, size_after=n, at=AT
            )
        case "pause_reconciliation":
            inv.pause(TerminalReason.RECONCILIATION_REQUIRED, question="?", at=AT)
        case "change_settings":
            inv.change_settings(inv.budget, RunSettings(max_repeated_failures=n + 1), at=AT)
        case "pause":
            inv.pause(TerminalReason.CLARIFICATION_REQUIRED, question="?", at=AT)
        case _:
            apply(inv, command, n)
