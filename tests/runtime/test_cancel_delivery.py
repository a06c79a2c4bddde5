"""How a cancel request reaches a run: the model call it interrupts, the batch it stops.

The Controller calls the model from its own task under one cancel scope (the
deadline and a cancel request together) and runs each call of a batch in a task
of the run's nursery under one scope (its timeout, the deadline, a cancel
request). These tests drive the public ``Runtime`` on real SQLite files.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

import loop_actors.runtime.controller as controller_module
from aggregates.invocation import DecisionProposed, ResultsCommitted, Terminated
from aggregates.lease import QueueStatus
from loop_actors import (
    AccessRequest,
    Agent,
    CancelResult,
    ErrorClass,
    ModelReply,
    ModelRequest,
    Runtime,
    ScriptedModel,
    TerminalReason,
    tool,
)
from tests.support.replies import calls


class BlockingModel:
    """A model whose call waits until cancelled (and says when it started)."""

    def __init__(self) -> None:
        self.asked = trio.Event()

    async def decide(self, request: ModelRequest) -> ModelReply:
        self.asked.set()
        await trio.sleep_forever()
        raise AssertionError("not reached")


async def test_a_cancel_request_interrupts_a_waiting_model_call(db_url: str) -> None:
    model = BlockingModel()
    agent = Agent("a", model)
    outcomes: list[Any] = []
    async with Runtime(db_url) as runtime:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def go() -> None:
                    outcomes.append(await runtime.run(agent, "g", invocation_id="inv"))

                nursery.start_soon(go)
                await model.asked.wait()
                assert runtime.cancel("inv", detail="by the test") is True
        events = await runtime.history("inv")
    (outcome,) = outcomes
    assert outcome.reason is TerminalReason.CANCELLED
    assert outcome.detail == "cancel requested: by the test"
    assert [e for e in events if isinstance(e, DecisionProposed)] == []  # nothing proposed
    assert isinstance(events[-1], Terminated)


async def test_a_cancel_requested_before_a_batch_starts_runs_none_of_its_calls(
    db_url: str,
) -> None:
    """A cancel that arrives while the batch is authorised: it is dispatched, no call starts."""
    ran: list[str] = []

    @tool
    async def read(key: str) -> str:
        """Answer at once."""
        ran.append(key)
        return key

    runtime = Runtime(db_url)

    def policy(request: AccessRequest) -> bool:
        runtime.cancel("inv")  # the run is between its decision and its dispatch
        return True

    model = ScriptedModel([calls(("r1", "read", {"key": "a"}), ("r2", "read", {"key": "b"}))])
    agent = Agent("a", model, [read], policy=policy)
    async with runtime:
        with trio.fail_after(10):
            outcome = await runtime.run(agent, "g", invocation_id="inv")
        events = await runtime.history("inv")
    assert outcome.reason is TerminalReason.CANCELLED
    assert ran == []
    (committed,) = [e for e in events if isinstance(e, ResultsCommitted)]
    for result in committed.results:
        assert result.error is not None
        assert result.error.error_class is ErrorClass.CANCELLED
        assert "never started" in result.error.message


async def test_a_call_that_shields_itself_from_a_cancel_is_given_up_after_the_grace(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calls that finished keep their results; one still running is recorded unreported."""
    monkeypatch.setattr(controller_module, "CANCEL_GRACE_S", 0.05)
    started = trio.Event()
    finished: list[str] = []

    @tool
    async def stubborn(key: str) -> str:
        """Ignore a cancellation for a while."""
        started.set()
        with trio.CancelScope(shield=True):
            await trio.sleep(1.0)
        finished.append(key)
        return key

    @tool
    async def quick(key: str) -> str:
        """Answer at once."""
        return key

    model = ScriptedModel([calls(("s", "stubborn", {"key": "a"}), ("q", "quick", {"key": "b"}))])
    agent = Agent("a", model, [stubborn, quick])
    outcomes: list[Any] = []
    async with Runtime(db_url) as runtime:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def go() -> None:
                    outcomes.append(await runtime.run(agent, "g", invocation_id="inv"))

                nursery.start_soon(go)
                await started.wait()
                assert runtime.cancel("inv") is True
        events = await runtime.history("inv")
    (outcome,) = outcomes
    assert outcome.reason is TerminalReason.CANCELLED
    (committed,) = [e for e in events if isinstance(e, ResultsCommitted)]
    by_id = {r.call_id: r for r in committed.results}
    assert by_id["q"].ok
    error = by_id["s"].error
    assert error is not None
    assert error.error_class is ErrorClass.CANCELLED
    assert "before this call reported" in error.message
    # The run returned only once the shielded call was done (nothing outlives the run).
    assert finished == ["a"]


def _approval_agent() -> Agent:
    """An agent whose one call needs approval: every run of it pauses ``approval_required``."""

    @tool(requires_approval=True)
    async def pay(amount: int) -> str:
        """Pay (only once a person approved)."""
        return f"paid {amount}"

    return Agent("payer", ScriptedModel([calls(("c1", "pay", {"amount": 5}))]), [pay])


async def _queue_statuses(db_url: str, ids: list[str]) -> dict[str, QueueStatus | None]:
    """The queue row's status of each invocation, read by a runtime of its own."""
    async with Runtime(db_url) as reader:
        queue = reader.driver.leases.queue
        rows = {i: await reader.driver.leases.call(queue.row, i) for i in ids}
    return {i: row.status if row is not None else None for i, row in rows.items()}


RACE_ROUNDS = 30
"""Runs paused then cancelled (or approved) at once, in one runtime: the race was lost
in most rounds before the fix."""


async def test_cancelling_a_just_paused_invocation_in_its_runtime_ends_its_queue_row(
    db_url: str,
) -> None:
    """The row ends ``ended``, not ``paused``: the run's own release comes first.

    The run that paused gives its lease back in the background; a cancel right after, in
    the same runtime, used to find the row still claimed, leave it alone, and let that
    release write ``paused`` after the invocation had ended.
    """
    agent = _approval_agent()
    ids = [f"pay-{n}" for n in range(RACE_ROUNDS)]
    with trio.fail_after(60):
        async with Runtime(db_url) as runtime:
            for invocation_id in ids:
                paused = await runtime.run(agent, "pay 5", invocation_id=invocation_id)
                assert paused.reason is TerminalReason.APPROVAL_REQUIRED
                assert await runtime.request_cancel(invocation_id, by="ops") is CancelResult.ENDED
        statuses = await _queue_statuses(db_url, ids)
    assert statuses == dict.fromkeys(ids, QueueStatus.ENDED)


async def test_approving_a_just_paused_invocation_in_its_runtime_makes_its_row_runnable(
    db_url: str,
) -> None:
    """The same race, for an approval: the row is ``runnable`` for a worker, not ``paused``."""
    agent = _approval_agent()
    ids = [f"pay-{n}" for n in range(RACE_ROUNDS)]
    with trio.fail_after(60):
        async with Runtime(db_url) as runtime:
            for invocation_id in ids:
                paused = await runtime.run(agent, "pay 5", invocation_id=invocation_id)
                assert paused.digest is not None
                await runtime.approve(invocation_id, digest=paused.digest, by="ops")
        statuses = await _queue_statuses(db_url, ids)
    assert statuses == dict.fromkeys(ids, QueueStatus.RUNNABLE)
