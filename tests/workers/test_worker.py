"""Submission, workers, leases and fencing in one process (the real-process stories: scenarios/).

Bad inputs tried: a worker with no agent, two agents of one name, a concurrency of 0,
a lease of 0.5 s, a negative grace; a submit of an existing id with another goal; a
resume of an invocation another holder drives; renewals that never arrive.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from aggregates.lease import QueueStatus
from loop_actors import (
    Agent,
    InvocationExistsError,
    LeaseHeldError,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    StoreUnavailableError,
    TerminalReason,
    ToolContext,
    UsageError,
    Worker,
    WorkerReport,
    tool,
)
from loop_actors.store.queue import WorkQueue
from tests.support.workers import AGENT, look, queue_row, two_steps


@tool(name="look", requires_approval=True)
def guarded_look(item: str) -> str:
    """Look something up, once a person approved."""
    return f"saw {item}"


async def test_submitted_invocations_are_recorded_runnable_and_a_worker_drives_them_all(
    db_url: str,
) -> None:
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            ids = [
                await runtime.submit(AGENT, f"goal {n}", invocation_id=f"s-{n}") for n in range(6)
            ]
            assert ids == [f"s-{n}" for n in range(6)]
            assert [type(e).__name__ for e in await runtime.history("s-0")] == ["InvocationStarted"]
        assert (await queue_row(db_url, "s-0")).status is QueueStatus.RUNNABLE
        report = await Worker(AGENT, db_url, concurrency=4, poll_s=0.05).run(until_idle=True)
    assert report.claimed == 6
    assert report.outcomes == {"completed": 6}
    async with Runtime(db_url) as runtime:
        for n in range(6):
            outcome = await runtime.resume(f"s-{n}", AGENT)  # nothing runs: it has ended
            assert outcome.answer == f"done goal {n}"
    row = await queue_row(db_url, "s-3")
    assert (row.status, row.holder) == (QueueStatus.ENDED, None)


async def test_submitting_an_existing_id_returns_it_and_records_nothing(db_url: str) -> None:
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            first = await runtime.submit(AGENT, "same goal", invocation_id="dup")
            second = await runtime.submit(AGENT, "same goal", invocation_id="dup")
            assert first == second == "dup"
            assert len(await runtime.history("dup")) == 1
            with pytest.raises(InvocationExistsError):
                await runtime.submit(AGENT, "another goal", invocation_id="dup")
            generated = await runtime.submit(AGENT, "no id given")
            assert len(generated) == 32


@pytest.mark.parametrize(
    "arguments",
    [
        {"agents": []},
        {"agents": [AGENT, Agent("looker", ScriptedModel(two_steps))]},
        {"agents": [AGENT], "concurrency": 0},
        {"agents": [AGENT], "lease_s": 0.5},
        {"agents": [AGENT], "grace_s": -1},
        {"agents": ["looker"]},
    ],
)
def test_a_worker_refuses_bad_settings(arguments: dict[str, Any], db_url: str) -> None:
    with pytest.raises(UsageError):
        Worker(db_url=db_url, **arguments)


async def test_an_approved_invocation_becomes_runnable_and_a_worker_finishes_it(
    db_url: str,
) -> None:
    def asks(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c1", "name": "look", "arguments": {"item": "x"}}],
            }
        return {"kind": "final", "answer": "approved and done"}

    agent = Agent("careful", ScriptedModel(asks), [guarded_look])
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await runtime.submit(agent, "g", invocation_id="needs-ok")
        report = await Worker(agent, db_url, poll_s=0.05).run(until_idle=True)
        assert report.outcomes == {"approval_required": 1}
        assert (await queue_row(db_url, "needs-ok")).status is QueueStatus.PAUSED
        # Paused: an idle worker does not take it.
        assert (await Worker(agent, db_url, poll_s=0.05).run(until_idle=True)).claimed == 0
        async with Runtime(db_url) as runtime:
            paused = await runtime.load("needs-ok")
            assert paused.paused is not None
            await runtime.approve("needs-ok", digest=paused.paused.proposal_digest or "", by="op")
        assert (await queue_row(db_url, "needs-ok")).status is QueueStatus.RUNNABLE
        report = await Worker(agent, db_url, poll_s=0.05).run(until_idle=True)
    assert report.outcomes == {"completed": 1}


class Gate:
    """A model that answers step 1 only once released (so a test can act while a run waits)."""

    def __init__(self) -> None:
        self.asking = trio.Event()
        self.release = trio.Event()

    async def decide(self, request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            self.asking.set()
            await self.release.wait()
            return {
                "kind": "tool_calls",
                "calls": [
                    {"id": "c1", "name": "look", "arguments": {"item": "from-the-fenced-worker"}}
                ],
            }
        return {"kind": "final", "answer": "finished"}


async def test_a_resume_is_refused_while_a_worker_holds_the_lease_and_take_over_fences_it(
    db_url: str,
) -> None:
    gate = Gate()
    slow = Agent("looker", ScriptedModel(gate.decide), [look])
    worker = Worker(slow, db_url, poll_s=0.05)
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await runtime.submit(slow, "g", invocation_id="held")
        async with trio.open_nursery() as nursery:
            reports: list[Any] = []

            async def work() -> None:
                reports.append(await worker.run(until_idle=True))

            nursery.start_soon(work)
            await gate.asking.wait()
            async with Runtime(db_url) as other:
                with pytest.raises(LeaseHeldError) as refused:
                    await other.resume("held", AGENT)
                assert refused.value.holder == worker.worker_id
                assert str(refused.value).startswith("invocation 'held' is being driven by worker:")
                # `run --id` of the same id is refused the same way.
                with pytest.raises(LeaseHeldError):
                    await other.run(AGENT, "g", invocation_id="held")
                taken = await other.resume("held", AGENT, take_over=True)
            gate.release.set()
    assert taken.reason is TerminalReason.COMPLETED
    # The worker's late decision was refused at the aggregate version: it ends lease_lost.
    assert reports[0].outcomes == {"lease_lost": 1}
    async with Runtime(db_url) as runtime:
        history = await runtime.history("held")
    kinds = [type(event).__name__ for event in history]
    assert kinds[:2] == ["InvocationStarted", "LeaseAcquired"]
    assert "from-the-fenced-worker" not in repr(
        history
    )  # nothing of the fenced-off worker was recorded
    assert kinds.count("LeaseAcquired") == 1  # the take-over (a first claim fences nobody)


async def test_a_stopped_worker_stops_its_runs_at_a_commit_and_another_finishes_them(
    db_url: str,
) -> None:
    gate = Gate()
    slow = Agent("looker", ScriptedModel(gate.decide), [look])
    first = Worker(slow, db_url, poll_s=0.05, grace_s=10)
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            for n in range(3):
                await runtime.submit(slow, "g", invocation_id=f"drain-{n}")
        async with trio.open_nursery() as nursery:
            reports: list[Any] = []

            async def work() -> None:
                reports.append(await first.run())

            nursery.start_soon(work)
            await gate.asking.wait()
            first.stop()
            gate.release.set()
        assert reports[0].drained == 3  # each stopped after committing its dispatched batch
        assert reports[0].abandoned == 0
        for n in range(3):
            row = await queue_row(db_url, f"drain-{n}")
            assert (row.status, row.holder) == (QueueStatus.RUNNABLE, None)
        second = await Worker(AGENT, db_url, poll_s=0.05).run(until_idle=True)
    assert second.outcomes == {"completed": 3}
    async with Runtime(db_url) as runtime:
        kinds = [type(e).__name__ for e in await runtime.history("drain-0")]
    # A drained lease was given back: the second worker fenced nobody off.
    assert kinds.count("LeaseAcquired") == 0


async def test_a_run_whose_lease_cannot_be_renewed_starts_no_write_and_records_nothing(
    db_url: str,
) -> None:
    """Bad input: every heartbeat fails (the queue's database does not answer)."""
    paid: list[str] = []

    def ask_service(effect_key: str) -> Reconciled:
        return (
            Reconciled(status="committed", receipt="paid")
            if paid
            else Reconciled(status="not_found")
        )

    @tool(effect="write", reconcile=ask_service)
    def pay(to: str) -> str:
        """Pay someone."""
        paid.append(to)
        return "paid"

    async def slow(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            await trio.sleep(1.2)  # longer than the lease: it cannot have been renewed
            return {
                "kind": "tool_calls",
                "calls": [{"id": "p", "name": "pay", "arguments": {"to": "bob"}}],
            }
        return {"kind": "final", "answer": "done"}

    agent = Agent("payer", ScriptedModel(slow), [pay])

    def refuse(**_: Any) -> set[str]:
        raise StoreUnavailableError("the queue's database does not answer")

    with trio.fail_after(30):
        async with Runtime(db_url, lease_s=1) as runtime:
            runtime._lease_keeper().queue.renew = refuse  # type: ignore[method-assign]
            outcome = await runtime.run(agent, "pay bob", invocation_id="unrenewed")
            history = await runtime.history("unrenewed")
    assert outcome.reason is TerminalReason.LEASE_LOST
    assert paid == []  # the write never started
    # The dispatch was committed (under the lease), nothing after it.
    assert [type(e).__name__ for e in history] == [
        "InvocationStarted",
        "DecisionProposed",
        "BatchDispatched",
    ]
    # Once the lease ran out, a resume takes it over and the write runs once.
    await trio.sleep(0.2)
    with trio.fail_after(30):
        resumed = await Runtime(db_url).resume("unrenewed", agent)
    assert resumed.reason is TerminalReason.COMPLETED
    assert paid == ["bob"]


async def test_a_worker_whose_renewals_come_late_claims_its_own_run_again_and_drives_it_once(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad input: no renewal arrives (as from a busy event loop); the lease runs out mid-run."""
    looked: list[str] = []

    @tool(name="look")
    def counted_look(item: str) -> str:
        """Look something up, counted."""
        looked.append(item)
        return f"saw {item}"

    async def late(request: ModelRequest) -> dict[str, Any]:
        if request.step == 2:
            await trio.sleep(1.5)  # past the lease: the worker's poll finds its row claimable
        if request.step < 3:
            item = f"x{request.step}"
            call = {"id": f"c{request.step}", "name": "look", "arguments": {"item": item}}
            return {"kind": "tool_calls", "calls": [call]}
        return {"kind": "final", "answer": "done"}

    def refuse(self: WorkQueue, **_: Any) -> set[str]:
        raise StoreUnavailableError("the renewal does not arrive")

    agent = Agent("late-looker", ScriptedModel(late), [counted_look])
    with trio.fail_after(30):
        await Runtime(db_url).submit(agent, "look twice", invocation_id="late")
        monkeypatch.setattr(WorkQueue, "renew", refuse)
        report = await Worker(agent, db_url, concurrency=2, lease_s=1, poll_s=0.05).run(
            until_idle=True
        )
        async with Runtime(db_url) as runtime:
            history = [type(e).__name__ for e in await runtime.history("late")]
    assert report.outcomes == {"completed": 1}
    assert report.failed == 0
    assert report.claimed >= 2  # its own row, claimed again
    assert looked == ["x1", "x2"]  # each step's call ran once
    assert "LeaseAcquired" not in history  # nobody else held it: no takeover to record
    assert (await queue_row(db_url, "late")).status is QueueStatus.ENDED


@tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"), timeout_s=120)
async def wait_forever(context: ToolContext) -> str:
    """A write that never returns by itself (until its run is abandoned)."""
    del context
    await trio.sleep_forever()


def _waits_forever(request: ModelRequest) -> dict[str, Any]:
    del request
    return {"kind": "tool_calls", "calls": [{"id": "w", "name": "wait_forever"}]}


async def test_a_run_past_the_grace_period_is_counted_abandoned(db_url: str) -> None:
    stuck = Agent("stuck", ScriptedModel(_waits_forever), [wait_forever])
    worker = Worker(stuck, db_url, poll_s=0.05, grace_s=0.5)
    with trio.fail_after(60):
        async with Runtime(db_url) as runtime:
            await runtime.submit(stuck, "wait", invocation_id="stuck-1")
        reports: list[WorkerReport] = []
        async with trio.open_nursery() as nursery:

            async def work() -> None:
                reports.append(await worker.run())

            nursery.start_soon(work)
            while not worker.running:  # noqa: ASYNC110 - the worker's claim, not an event of ours
                await trio.sleep(0.02)
            await trio.sleep(0.2)  # its write is under way
            worker.stop()
    (report,) = reports
    assert (report.abandoned, report.drained, report.failed, report.outcomes) == (1, 0, 0, {})
