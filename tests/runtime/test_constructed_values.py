"""Models built with ``model_construct`` that user code hands the runtime never crash a run.

Each test runs through the public API on a real SQLite file and checks the run ends
typed and what it stored reads back and verifies. Inputs tried:

* a model's reply: ``Final.model_construct(answer=1.5)``, ``ToolCalls.model_construct(
  calls="x")``, ``CannotContinue.model_construct(reason=5)`` (once stored unreadable),
  ``Clarification.model_construct(question=None)``, ``ModelReply.model_construct()``
  with no proposal at all; each rejected as malformed, as a malformed dict is;
* its usage: ``ModelReply.model_construct(usage=...)`` with an object that is not a
  ``Usage`` (every figure present) and with text: ``model_error``;
* a write's ``reconcile``: ``Reconciled.model_construct`` with the status ``bogus``,
  with no status, with an int reason (the reconciler task died, the run raised
  ``trio.EndOfChannel``): the service counts as unreachable, the run pauses
  ``reconciliation_required`` with the write still open, and a resume settles it once;
  a sweep (``Runtime.reconcile``) reports it waiting;
* a replay's filter: ``ReplayFilter.model_construct(reason="completed")`` (a text, not
  a ``TerminalReason``: it matched nothing, silently) is read as the reason; with the
  reason ``bogus``, a ``UsageError``.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from aggregates.decisions import RejectionClass
from aggregates.effect import effect_key
from aggregates.invocation import DecisionProposed
from loop_actors import (
    Agent,
    CannotContinue,
    Clarification,
    EffectStatus,
    Final,
    ModelReply,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolCalls,
    ToolContext,
    UsageError,
    tool,
)
from loop_actors.runtime.replay import ReplayFilter
from loop_actors.store.store import EventStore
from tests.support.constructed import NOT_USAGES, constructed
from tests.support.replies import FINAL, calls
from tests.support.runs import assert_readable, drive, results_of


class FirstReply:
    """Answers ``first()`` at step 1, then a plain final answer."""

    def __init__(self, first: Any) -> None:
        self.first = first

    async def decide(self, request: ModelRequest) -> ModelReply:
        if request.step == 1:
            reply = self.first()
            assert isinstance(reply, ModelReply)
            return reply
        return ModelReply(proposal=FINAL)


REPLIES: dict[str, tuple[Any, str]] = {
    "final-float-answer": (
        lambda: ModelReply(proposal=constructed(Final, answer=1.5)),
        "final.answer:",
    ),
    "tool-calls-as-text": (
        lambda: ModelReply(proposal=constructed(ToolCalls, calls="x")),
        "tool_calls.calls:",
    ),
    "cannot-continue-int-reason": (
        lambda: ModelReply(proposal=constructed(CannotContinue, reason=5)),
        "cannot_continue.reason:",
    ),
    "clarification-none-question": (
        lambda: ModelReply(proposal=constructed(Clarification, question=None)),
        "clarification.question:",
    ),
    "reply-without-proposal": (lambda: constructed(ModelReply), "decision:"),
}


@pytest.mark.parametrize("name", list(REPLIES))
async def test_a_constructed_reply_is_rejected_as_malformed_and_the_run_goes_on(
    db_url: str, name: str, shown_warnings: list[warnings.WarningMessage]
) -> None:
    reply, problem = REPLIES[name]
    outcome, events = await drive(Agent("a", FirstReply(reply)), db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.answer == "done"
    rejected = [e.rejection for e in events if isinstance(e, DecisionProposed) and e.rejection]
    assert [r.rejection_class for r in rejected] == [RejectionClass.SCHEMA_INVALID]
    assert rejected[0].problems[0].startswith(problem), rejected[0].problems
    assert not shown_warnings, [str(w.message) for w in shown_warnings]


@pytest.mark.parametrize("usage", NOT_USAGES)
async def test_a_constructed_reply_whose_usage_is_not_a_usage_ends_model_error(
    db_url: str, usage: Any
) -> None:
    model = FirstReply(lambda: constructed(ModelReply, proposal=FINAL, usage=usage))
    outcome, _ = await drive(Agent("a", model), db_url)
    assert outcome.reason is TerminalReason.MODEL_ERROR
    assert "not a Usage" in (outcome.detail or "")


class Service:
    """A service whose first write's reply is lost; ``answer`` is what reconcile says."""

    def __init__(self, answer: Reconciled) -> None:
        self.answer = answer
        self.writes: list[tuple[str, int]] = []

    def reconcile(self, key: str) -> Reconciled:
        return self.answer

    def agent(self) -> Agent:
        @tool(effect="write", reconcile=self.reconcile)
        async def pay(amount: int, context: ToolContext) -> dict[str, int]:
            """Pay; the first reply is lost."""
            assert context.effect_key is not None
            self.writes.append((context.effect_key, context.attempt))
            if len(self.writes) == 1:
                raise ConnectionError("reply lost")
            return {"paid": amount}

        return Agent("payer", ScriptedModel([calls(("p1", "pay", {"amount": 5})), FINAL]), [pay])


CONSTRUCTED_ANSWERS = {
    "bogus-status": constructed(Reconciled, status="bogus"),
    "no-status": constructed(Reconciled),
    "int-reason": constructed(Reconciled, status="rejected", reason=5),
}


@pytest.mark.parametrize("name", list(CONSTRUCTED_ANSWERS))
async def test_a_constructed_reconciled_is_an_unreachable_service_and_the_write_stays_open(
    db_url: str, name: str, shown_warnings: list[warnings.WarningMessage]
) -> None:
    service = Service(CONSTRUCTED_ANSWERS[name])
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            paused = await runtime.run(service.agent(), "g", invocation_id="inv")
    assert paused.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert "reconcile() returned a malformed Reconciled" in (paused.detail or "")
    key = effect_key("inv", 1, "p1")
    store = EventStore(db_url, create=False)
    try:
        ledger = store.get_effect(key)
    finally:
        store.close()
    assert ledger is not None
    assert ledger.status is EffectStatus.OUTCOME_UNKNOWN
    assert_readable(db_url)
    assert not shown_warnings, [str(w.message) for w in shown_warnings]


@asynccontextmanager
async def paused_by_a_bogus_status(db_url: str) -> AsyncIterator[tuple[Runtime, Service]]:
    """A run paused because its write's reconcile answered a constructed ``bogus`` status."""
    service = Service(constructed(Reconciled, status="bogus"))
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            paused = await runtime.run(service.agent(), "g", invocation_id="inv")
            assert paused.reason is TerminalReason.RECONCILIATION_REQUIRED
            yield runtime, service


async def test_a_sweep_that_gets_a_constructed_reconciled_reports_the_write_waiting(
    db_url: str,
) -> None:
    async with paused_by_a_bogus_status(db_url) as (runtime, service):
        report = await runtime.reconcile(service.agent())
    assert (report.effects_settled, report.effects_open, report.effects_waiting) == (0, 1, 1)
    assert_readable(db_url)


async def test_a_write_paused_by_a_constructed_reconciled_is_settled_once_by_a_later_resume(
    db_url: str,
) -> None:
    async with paused_by_a_bogus_status(db_url) as (runtime, service):
        service.answer = Reconciled(status="committed", receipt={"paid": 5})
        outcome = await runtime.resume("inv", service.agent())
        events = await runtime.history("inv")
    assert outcome.reason is TerminalReason.COMPLETED
    assert service.writes == [(effect_key("inv", 1, "p1"), 1)]  # written once, never again
    (result,) = results_of(events)
    assert result.effect_status is EffectStatus.RECONCILED
    assert result.output == {"paid": 5}
    assert_readable(db_url)


async def test_a_replay_filter_built_without_validation_is_validated_again(db_url: str) -> None:
    """Its reason as text is read as the reason; a reason that is none is a UsageError."""
    agent = Agent("a", ScriptedModel([FINAL]))
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await runtime.run(agent, "g", invocation_id="inv")
            report = await runtime.replay(
                agent, every=True, where=constructed(ReplayFilter, reason="completed")
            )
            with pytest.raises(UsageError, match=r"where is a malformed ReplayFilter: reason:"):
                await runtime.replay(
                    agent, every=True, where=constructed(ReplayFilter, reason="bogus")
                )
    assert [result.invocation_id for result in report.results] == ["inv"]
