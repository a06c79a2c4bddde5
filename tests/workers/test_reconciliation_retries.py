"""A run paused for a service that could not answer is asked again by a worker, unprompted.

A write whose outcome is unknown (its call timed out) is reconciled with its service;
while the service cannot answer, the run pauses ``reconciliation_required``. Its queue
row used to stay ``paused`` until someone ran ``loop-actors reconcile``; now a worker
asks again after a wait that grows with the pause (``retry_reconciliation``), and the
run goes on once the service answers — the write made once. A write only a person can
settle (its tool has no ``reconcile``) still waits ``paused``.

Bad inputs tried: a service whose ``reconcile`` raises (down), then answers; a write
tool with no ``reconcile`` at all.
"""

from __future__ import annotations

from typing import Any

import trio

from aggregates.lease import (
    RECONCILE_RETRY_FIRST_S,
    RECONCILE_RETRY_MAX_S,
    QueueStatus,
    retry_reconciliation,
)
from loop_actors import (
    Agent,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolContext,
    Worker,
    tool,
)
from tests.support.workers import queue_row


class Service:
    """A payment service that is slow to the first call, then down, then back."""

    def __init__(self) -> None:
        self.payments: list[str] = []
        self.down = True
        self.asked = 0

    async def pay(self, to: str, key: str) -> str:
        self.payments.append(key)
        if len(self.payments) == 1:
            await trio.sleep(5)  # past the call's timeout: its outcome is unknown
        return f"paid {to}"

    def reconcile(self, effect_key: str) -> Reconciled:
        self.asked += 1
        if self.down:
            raise ConnectionError("payments service unreachable")
        if effect_key in self.payments:
            return Reconciled(status="committed", receipt="paid (reconciled)")
        return Reconciled(status="not_found")


def pay_then_answer(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "p", "name": "pay", "arguments": {"to": "bob"}}],
        }
    return {"kind": "final", "answer": f"done: {request.turns[-1].results[0].output}"}


def payer(service: Service, *, with_reconcile: bool = True) -> Agent:
    @tool(
        effect="write",
        timeout_s=0.2,
        reconcile=service.reconcile if with_reconcile else None,
    )
    async def pay(to: str, context: ToolContext) -> str:
        """Pay someone."""
        assert context.effect_key is not None
        return await service.pay(to, context.effect_key)

    return Agent("payer", ScriptedModel(pay_then_answer), [pay])


def test_the_wait_before_asking_again_doubles_from_five_seconds_to_fifteen_minutes() -> None:
    assert retry_reconciliation(0).delay_s == RECONCILE_RETRY_FIRST_S
    assert retry_reconciliation(40).delay_s == 40
    assert retry_reconciliation(10 * 3600).delay_s == RECONCILE_RETRY_MAX_S
    assert retry_reconciliation(40).status is QueueStatus.RUNNABLE


async def test_a_worker_asks_the_service_again_and_finishes_the_run_once_it_answers(
    db_url: str,
) -> None:
    service = Service()
    agent = payer(service)
    with trio.fail_after(60):
        async with Runtime(db_url) as runtime:
            outcome = await runtime.run(agent, "pay bob", invocation_id="unsettled")
        assert outcome.reason is TerminalReason.RECONCILIATION_REQUIRED
        row = await queue_row(db_url, "unsettled")
        assert row.status is QueueStatus.RUNNABLE  # not left paused for a person
        assert row.due_at - row.updated_at >= RECONCILE_RETRY_FIRST_S - 0.5
        asked_before = service.asked
        service.down = False
        worker = Worker(agent, db_url, poll_s=0.05)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            while (await queue_row(db_url, "unsettled")).status is not QueueStatus.ENDED:  # noqa: ASYNC110 - the queue row: no event to wait on
                await trio.sleep(0.1)
            worker.stop()
        async with Runtime(db_url) as runtime:
            finished = await runtime.resume("unsettled", agent)  # ended: nothing runs
            kinds = [type(e).__name__ for e in await runtime.history("unsettled")]
    assert finished.reason is TerminalReason.COMPLETED
    assert finished.answer == "done: paid (reconciled)"
    assert service.asked > asked_before
    assert len(service.payments) == 1  # the write was made once, never sent again
    assert kinds.count("Paused") == 1


async def test_a_write_only_a_person_can_settle_stays_paused(db_url: str) -> None:
    """Bad input: the write's tool has no ``reconcile``: no worker asks anything again."""
    service = Service()
    agent = payer(service, with_reconcile=False)
    with trio.fail_after(60):
        async with Runtime(db_url) as runtime:
            outcome = await runtime.run(agent, "pay bob", invocation_id="by-hand")
    assert outcome.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert (await queue_row(db_url, "by-hand")).status is QueueStatus.PAUSED
