"""Workers drive trees of invocations: children and handoff targets are runnable rows.

On SQLite and on a real PostgreSQL: a worker's run submits each child of an agent the
workers serve, so that any worker claims it (a tree spreads over workers); a child that
no worker claims in time (all busy) is driven by the run that started it; a child of an
agent no worker serves (``run_agent`` in a tool's body) is driven at once. A parent
cancelled while its child runs on another worker has that child cancelled. A run that
hands off has its target submitted for any worker. Every charge is made once, and no
queue row of a tree is left runnable or claimed once it ended.

Bad inputs tried: a worker whose agents reach two different agents of one name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.handoffs import handoff_id_of
from aggregates.invocation import BatchDispatched, BudgetReserved
from aggregates.lease import QueueStatus
from loop_actors import (
    Agent,
    EventStore,
    InvocationNotFoundError,
    ModelRequest,
    Outcome,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolContext,
    UsageError,
    Worker,
    WorkerReport,
    tool,
)
from tests.support.children_app import BOSS, ORCHESTRATOR, PAYER, TRIAGE, charges
from tests.support.workers import queue_row


async def test_a_worker_drives_a_submitted_parent_and_its_children_once(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges.txt"))
    with trio.fail_after(60):
        async with Runtime(store_url) as runtime:
            await runtime.submit(BOSS, "pay them", invocation_id="root")
        report = await Worker([BOSS, PAYER], store_url, concurrency=4, poll_s=0.05).run(
            until_idle=True
        )
        async with Runtime(store_url) as runtime:
            outcome = await runtime.resume("root", BOSS)  # nothing runs: it has ended
            events = await runtime.history("root")
            child_ids = [e.child_id for e in events if isinstance(e, BudgetReserved)]
            children = [await runtime.load(child_id) for child_id in child_ids]
    assert report.claimed == 3  # the parent, then each child: runnable rows
    assert report.outcomes == {"completed": 3}
    assert (outcome.reason, outcome.answer) == (TerminalReason.COMPLETED, "both paid")
    assert sorted(amount for _, amount in charges()) == [10, 20]
    assert len(children) == 2
    assert all(c.terminated and c.terminated.reason is TerminalReason.COMPLETED for c in children)
    for invocation_id in ["root", *child_ids]:
        row = await queue_row(store_url, invocation_id)
        assert (row.status, row.holder) == (QueueStatus.ENDED, None), invocation_id


async def _serve_until_idle(
    store_url: str, agent: Agent, goal: str, root: str, *, concurrency: int
) -> tuple[WorkerReport, Outcome]:
    """Submit ``goal`` as ``root``, let one worker serving ``agent`` drive all there is,
    and give its report with the root's outcome (a resume that finds it ended)."""
    with trio.fail_after(90):
        async with Runtime(store_url) as runtime:
            await runtime.submit(agent, goal, invocation_id=root)
        worker = Worker([agent], store_url, concurrency=concurrency, poll_s=0.05)
        report = await worker.run(until_idle=True)
        async with Runtime(store_url) as runtime:
            return report, await runtime.resume(root, agent)


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` until it holds (the caller bounds the wait with ``trio.fail_after``)."""
    while not await check():  # noqa: ASYNC110 - the store, not this process, changes
        await trio.sleep(0.05)
    del what  # named for whoever reads a timeout's traceback


async def _held_by(store_url: str, invocation_id: str, holder: str) -> bool:
    row = await queue_row(store_url, invocation_id)
    return row is not None and row.holder == holder


async def _keep(worker: Worker, name: str, reports: dict[str, WorkerReport]) -> None:
    reports[name] = await worker.run()


async def _registered(store_url: str, holder: str) -> bool:
    async with Runtime(store_url) as runtime:
        keeper = runtime._lease_keeper()
        return await keeper.call(keeper.queue.holder, holder) is not None


async def _ended(store_url: str, invocation_id: str) -> bool:
    async with Runtime(store_url) as runtime:
        try:
            invocation = await runtime.load(invocation_id)
        except InvocationNotFoundError:
            return False
    return invocation.terminated is not None


async def test_the_children_of_a_busy_workers_run_are_claimed_by_another_worker(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges.txt"))
    reports: dict[str, WorkerReport] = {}
    parents = Worker([BOSS], store_url, concurrency=1, poll_s=0.5)  # its one slot: the parent
    children = Worker([PAYER], store_url, concurrency=4, poll_s=0.05)  # cannot claim the parent
    with trio.fail_after(90):
        async with Runtime(store_url) as runtime:
            await runtime.submit(BOSS, "pay them", invocation_id="root")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keep, children, "children", reports)
            await _until(lambda: _registered(store_url, children.worker_id), "children's worker")
            nursery.start_soon(_keep, parents, "parents", reports)
            await _until(lambda: _ended(store_url, "root"), "the tree to end")
            parents.stop()
            children.stop()
        async with Runtime(store_url) as runtime:
            outcome = await runtime.resume("root", BOSS)
            events = await runtime.history("root")
            child_ids = [e.child_id for e in events if isinstance(e, BudgetReserved)]
    assert (outcome.reason, outcome.answer) == (TerminalReason.COMPLETED, "both paid")
    assert (reports["parents"].claimed, reports["parents"].outcomes) == (1, {"completed": 1})
    assert (reports["children"].claimed, reports["children"].outcomes) == (2, {"completed": 2})
    assert sorted(amount for _, amount in charges()) == [10, 20]
    for invocation_id in ["root", *child_ids]:
        row = await queue_row(store_url, invocation_id)
        assert (row.status, row.holder) == (QueueStatus.ENDED, None), invocation_id


async def test_a_child_no_worker_is_free_to_claim_is_driven_by_its_parents_worker(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges.txt"))
    # One slot, which the parent takes: its children wait for a claim, then it drives them.
    report, outcome = await _serve_until_idle(store_url, BOSS, "pay them", "root", concurrency=1)
    assert (report.claimed, report.outcomes) == (1, {"completed": 1})
    assert (outcome.reason, outcome.answer) == (TerminalReason.COMPLETED, "both paid")
    assert sorted(amount for _, amount in charges()) == [10, 20]


async def test_a_child_of_an_agent_no_worker_serves_is_driven_at_once_by_its_parents_run(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_agent`` in a tool's body: its agent is not among those a worker serves."""
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges.txt"))
    report, outcome = await _serve_until_idle(
        store_url, ORCHESTRATOR, "fan out", "root", concurrency=4
    )
    assert (report.claimed, report.outcomes) == (1, {"completed": 1})
    assert outcome.reason is TerminalReason.COMPLETED
    assert sorted(amount for _, amount in charges()) == [1, 2, 3]


@tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"), timeout_s=120)
async def wait_for_release(context: ToolContext) -> str:
    """Wait until cancelled (a write in flight on another worker)."""
    del context
    await trio.sleep_forever()


def _waits(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {"kind": "tool_calls", "calls": [{"id": "w", "name": "wait_for_release"}]}
    return {"kind": "final", "answer": "released"}


WAITER = Agent("waiter", ScriptedModel(_waits), [wait_for_release])


def _delegates_to_waiter(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        call = {"id": "w", "name": "waiter", "arguments": {"goal": "wait"}}
        return {"kind": "tool_calls", "calls": [call]}
    return {"kind": "final", "answer": "waited"}


WAITING_PARENT = Agent("waiting_parent", ScriptedModel(_delegates_to_waiter), [WAITER.as_tool()])


async def test_a_parent_cancelled_while_its_child_runs_on_another_worker_cancels_that_child(
    store_url: str,
) -> None:
    reports: dict[str, WorkerReport] = {}
    parents = Worker([WAITING_PARENT], store_url, concurrency=1, poll_s=0.5)
    children = Worker([WAITER], store_url, concurrency=4, poll_s=0.05)
    with trio.fail_after(90):
        async with Runtime(store_url) as runtime:
            await runtime.submit(WAITING_PARENT, "delegate", invocation_id="root")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keep, children, "children", reports)
            await _until(lambda: _registered(store_url, children.worker_id), "children's worker")
            nursery.start_soon(_keep, parents, "parents", reports)
            child_id = await _child_of(store_url, "root")
            await _until(lambda: _held_by(store_url, child_id, children.worker_id), "the claim")
            async with Runtime(store_url) as runtime:
                await runtime.request_cancel("root", by="ops", reason="not needed")
            await _until(lambda: _ended(store_url, child_id), "the child to end")
            await _until(lambda: _ended(store_url, "root"), "the parent to end")
            parents.stop()
            children.stop()
        async with Runtime(store_url) as runtime:
            root = await runtime.load("root")
            child = await runtime.load(child_id)
            # The parent's call was cut short (outcome unknown); its child has ended since,
            # so the sweep settles the call from the child's recorded end.
            swept = await runtime.reconcile(WAITING_PARENT)
            events = await runtime.history("root")
        (key,) = [c.effect_key for e in events if isinstance(e, BatchDispatched) for c in e.calls]
        assert key is not None
        store = EventStore(store_url, read_only=True)
        try:
            effect = store.get_effect(key)
        finally:
            store.close()
    assert root.terminated is not None
    assert root.terminated.reason is TerminalReason.CANCELLED
    assert child.terminated is not None
    assert child.terminated.reason is TerminalReason.CANCELLED
    # Its worker read the parent's request for it (docs/explanation/child-invocations.md).
    assert (child.terminated.detail or "").endswith(
        "requested (its parent root was cancelled (requested by ops (not needed)))"
    )
    assert reports["children"].claimed == 1  # the child ran there, not in the parent's worker
    # The one left open is the child's own write (of its agent, cut short: its sweep's).
    assert (swept.effects_settled, swept.effects_waiting, swept.needs_person) == (1, 0, [])
    assert effect is not None
    assert effect.status.value == "reconciled"


async def _child_of(store_url: str, parent_id: str) -> str:
    """The id of the first child ``parent_id`` starts, once its batch names it."""
    while True:
        async with Runtime(store_url) as runtime:
            try:
                events = await runtime.history(parent_id)
            except InvocationNotFoundError:
                events = []
        found = [c.child_id for e in events if isinstance(e, BatchDispatched) for c in e.calls]
        if found and found[0] is not None:
            return found[0]
        await trio.sleep(0.05)


async def test_a_worker_submits_the_target_of_a_handoff_and_a_worker_claims_it(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges.txt"))
    # It serves triage: billing, which triage hands off to, is served with it.
    report, again = await _serve_until_idle(store_url, TRIAGE, "my refund", "t", concurrency=2)
    async with Runtime(store_url) as runtime:
        target = await runtime.load(handoff_id_of("t"))
    assert (report.claimed, report.outcomes) == (2, {"handed_off": 1, "completed": 1})
    assert target.handed_off_from is not None
    assert target.handed_off_from.source_id == "t"
    assert target.terminated is not None
    assert target.terminated.answer == "refunded 40"
    assert again.chain == ["t", handoff_id_of("t")]  # the resume follows it: nothing runs
    assert [amount for _, amount in charges()] == [-40]
    for invocation_id in ["t", handoff_id_of("t")]:
        row = await queue_row(store_url, invocation_id)
        assert (row.status, row.holder) == (QueueStatus.ENDED, None), invocation_id


def test_a_worker_refuses_agents_that_reach_two_different_agents_of_one_name(
    tmp_path: Path,
) -> None:
    other_payer = Agent("payer", ScriptedModel(lambda _: {"kind": "final", "answer": "x"}), [])
    other_boss = Agent("other_boss", BOSS.model, [other_payer.as_tool()])
    with pytest.raises(UsageError, match="two different agents named 'payer'"):
        Worker([BOSS, other_boss], f"sqlite:///{tmp_path / 's.db'}")
    # Served explicitly, the one given is the agent of that name.
    worker = Worker([BOSS, other_boss, PAYER], f"sqlite:///{tmp_path / 's.db'}")
    assert worker.agents["payer"] is PAYER
    assert sorted(worker.agents) == ["boss", "other_boss", "payer"]
