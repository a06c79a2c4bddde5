"""AsyncioRuntime: the runtime awaited from plain asyncio (each test is sync and calls asyncio.run)."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

from loop_actors import (
    Agent,
    ApprovalRefusedError,
    AsyncioRuntime,
    InvocationNotFoundError,
    ModelRequest,
    Outcome,
    Runtime,
    ScriptedModel,
    StoreUnavailableError,
    StoreUrlError,
    Submission,
    TerminalReason,
    ToolCall,
    ToolCalls,
    UsageError,
    tool,
)

TIMEOUT_S = 30  # every wait below is bounded by asyncio.timeout(TIMEOUT_S)


@tool
def double(n: int) -> int:
    """Twice n."""
    return 2 * n


def doubling_agent() -> Agent:
    script: list[dict[str, Any]] = [
        {"kind": "tool_calls", "calls": [{"id": "d1", "name": "double", "arguments": {"n": 21}}]},
        {"kind": "final", "answer": "42"},
    ]
    return Agent("doubler", ScriptedModel(script), tools=[double])


class Waiter:
    """A tool that waits (under trio) until cancelled, and says when it started."""

    def __init__(self) -> None:
        self.started = threading.Event()

        @tool(name="wait_for_courier")
        async def wait_for_courier() -> str:
            """Wait for the courier (for ever)."""
            self.started.set()
            await trio.sleep_forever()
            return "never"

        def always_wait(request: ModelRequest) -> ToolCalls:
            return ToolCalls(calls=[ToolCall(id=f"w{request.step}", name="wait_for_courier")])

        self.agent = Agent(
            "courier", ScriptedModel(always_wait), tools=[wait_for_courier], tool_timeout_s=600
        )

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.wait, TIMEOUT_S)


def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'asyncio.db'}"


def trio_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("loop-actors trio")]


def test_a_run_completes_when_awaited_from_asyncio(tmp_path: Path) -> None:
    async def main() -> tuple[Outcome, int]:
        async with asyncio.timeout(TIMEOUT_S), AsyncioRuntime(db(tmp_path)) as runtime:
            outcome = await runtime.run(doubling_agent(), "double 21", invocation_id="one")
            events = await runtime.history("one")
        return outcome, len(events)

    outcome, events = asyncio.run(main())
    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.answer == "42"
    assert events == 6  # started; proposed, dispatched; results; proposed, terminated
    # What asyncio recorded is what the trio runtime reads.
    recorded = Runtime(db(tmp_path)).run_sync(doubling_agent(), "double 21", invocation_id="one")
    assert recorded == outcome
    assert trio_threads() == []


def test_an_invocation_submitted_from_asyncio_is_runnable_and_resumed_there(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[str, Outcome]:
        async with asyncio.timeout(TIMEOUT_S), AsyncioRuntime(db(tmp_path)) as runtime:
            submitted = await runtime.submit(
                doubling_agent(), "double 21", invocation_id="sub", agent_ref="app:doubler"
            )
            # Nothing holds its lease: a resume (or a worker) drives it.
            outcome = await runtime.resume("sub", doubling_agent(), take_over=False)
        return submitted, outcome

    submitted, outcome = asyncio.run(main())
    assert submitted == "sub"
    assert (outcome.reason, outcome.answer) == (TerminalReason.COMPLETED, "42")

    async def queue_row() -> Any:
        async with Runtime(db(tmp_path)) as runtime:
            keeper = runtime._lease_keeper()
            return await keeper.call(keeper.queue.row, "sub")

    assert trio.run(queue_row).agent_ref == "app:doubler"  # kept for the workers
    assert trio_threads() == []


def test_many_goals_submitted_from_asyncio_come_back_in_order_and_again_record_nothing(
    tmp_path: Path,
) -> None:
    goals: list[str | Submission] = ["double 1", Submission("double 2", invocation_id="two")]

    async def main() -> tuple[list[str], list[str], int]:
        async with asyncio.timeout(TIMEOUT_S), AsyncioRuntime(db(tmp_path)) as runtime:
            first = await runtime.submit_many(doubling_agent(), goals, chunk_size=1)
            again = await runtime.submit_many(doubling_agent(), goals[1:])
            return first, again, len(await runtime.history("two"))

    first, again, events = asyncio.run(main())
    assert (len(first[0]), first[1], again, events) == (32, "two", ["two"], 1)
    assert trio_threads() == []


def test_many_concurrent_runs_complete_on_one_runtime(tmp_path: Path) -> None:
    async def main() -> list[Outcome]:
        async with asyncio.timeout(TIMEOUT_S), AsyncioRuntime(db(tmp_path)) as runtime:
            return await asyncio.gather(
                *(
                    runtime.run(doubling_agent(), "double 21", invocation_id=f"job-{n}")
                    for n in range(40)
                )
            )

    outcomes = asyncio.run(main())
    assert sorted(o.invocation_id for o in outcomes) == sorted(f"job-{n}" for n in range(40))
    assert {o.reason for o in outcomes} == {TerminalReason.COMPLETED}


def test_cancelling_the_asyncio_task_records_the_run_as_cancelled(tmp_path: Path) -> None:
    waiter = Waiter()

    async def main() -> tuple[Outcome, bool]:
        async with asyncio.timeout(TIMEOUT_S), AsyncioRuntime(db(tmp_path)) as runtime:
            task = asyncio.create_task(runtime.run(waiter.agent, "wait", invocation_id="w"))
            await waiter.wait_started()
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                cancelled = True
            else:
                cancelled = False
            # The cancellation was recorded before the task got its CancelledError.
            return Outcome.of(await runtime.load("w")), cancelled

    outcome, cancelled = asyncio.run(main())
    assert cancelled
    assert outcome.reason is TerminalReason.CANCELLED


def test_an_asyncio_timeout_around_a_run_records_it_as_cancelled(tmp_path: Path) -> None:
    waiter = Waiter()

    async def main() -> Outcome:
        async with asyncio.timeout(TIMEOUT_S), AsyncioRuntime(db(tmp_path)) as runtime:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await runtime.run(waiter.agent, "wait", invocation_id="w")
            return Outcome.of(await runtime.load("w"))

    assert asyncio.run(main()).reason is TerminalReason.CANCELLED
    assert waiter.started.is_set()


def test_errors_reach_asyncio_with_their_own_types(tmp_path: Path) -> None:
    """Bad inputs: an unknown invocation id (history, load, resume), an empty goal, an approval
    of an invocation that waits for none."""

    async def main() -> None:
        async with asyncio.timeout(TIMEOUT_S), AsyncioRuntime(db(tmp_path)) as runtime:
            with pytest.raises(InvocationNotFoundError):
                await runtime.history("nope")
            with pytest.raises(InvocationNotFoundError):
                await runtime.load("nope")
            with pytest.raises(InvocationNotFoundError):
                await runtime.resume("nope", doubling_agent())
            with pytest.raises(UsageError, match="non-empty"):
                await runtime.run(doubling_agent(), "  ")
            await runtime.run(doubling_agent(), "double 21", invocation_id="done")
            with pytest.raises(ApprovalRefusedError):
                await runtime.approve("done", digest="x", by="ann")
            # The runtime still works after all of these.
            assert len(await runtime.history("done")) == 6

    asyncio.run(main())


def test_closing_twice_is_fine_and_a_closed_runtime_refuses_calls(tmp_path: Path) -> None:
    """Bad inputs: a call after close, opening a closed runtime again, a call before opening."""

    async def main() -> None:
        never_opened = AsyncioRuntime(db(tmp_path))
        with pytest.raises(UsageError, match="not open"):
            await never_opened.history("x")
        await never_opened.aclose()
        runtime = AsyncioRuntime(db(tmp_path))
        async with asyncio.timeout(TIMEOUT_S), runtime:
            await runtime.run(doubling_agent(), "double 21", invocation_id="one")
        assert trio_threads() == []
        await runtime.aclose()
        await runtime.aclose()
        with pytest.raises(UsageError, match="not open"):
            await runtime.history("one")
        with pytest.raises(UsageError, match="opened before"):
            await runtime.__aenter__()

    asyncio.run(main())


def test_closing_with_a_run_in_flight_cancels_it_and_tells_its_caller(tmp_path: Path) -> None:
    waiter = Waiter()

    async def main() -> None:
        async with asyncio.timeout(TIMEOUT_S):
            runtime = AsyncioRuntime(db(tmp_path))
            async with runtime:
                task = asyncio.create_task(runtime.run(waiter.agent, "wait", invocation_id="w"))
                await waiter.wait_started()
            with pytest.raises(UsageError, match="closed during the call"):
                await task
            async with AsyncioRuntime(db(tmp_path)) as again:
                assert Outcome.of(await again.load("w")).reason is TerminalReason.CANCELLED

    asyncio.run(main())


def test_a_store_that_cannot_be_opened_raises_store_unavailable(tmp_path: Path) -> None:
    """Bad inputs: a database in a directory that does not exist; a malformed URL."""
    with pytest.raises(StoreUrlError):
        AsyncioRuntime("postgres-ish:/x")

    async def main() -> None:
        async with asyncio.timeout(TIMEOUT_S):
            with pytest.raises(StoreUnavailableError):
                async with AsyncioRuntime(f"sqlite:///{tmp_path / 'missing' / 'x.db'}"):
                    pass

    asyncio.run(main())
    assert trio_threads() == []


def test_a_paused_run_is_approved_and_resumed_from_asyncio(tmp_path: Path) -> None:
    @tool(effect="write", requires_approval=True)
    def refund(amount: int) -> str:
        """Refund an amount."""
        return f"refunded {amount}"

    def agent() -> Agent:
        script: list[dict[str, Any]] = [
            {
                "kind": "tool_calls",
                "calls": [{"id": "r1", "name": "refund", "arguments": {"amount": 5}}],
            },
            {"kind": "final", "answer": "done"},
        ]
        return Agent("refunds", ScriptedModel(script), tools=[refund])

    async def main() -> tuple[Outcome, Outcome]:
        async with asyncio.timeout(TIMEOUT_S), AsyncioRuntime(db(tmp_path)) as runtime:
            paused = await runtime.run(agent(), "refund", invocation_id="r")
            assert paused.digest is not None
            await runtime.approve("r", digest=paused.digest, by="ann")
            return paused, await runtime.resume("r", agent())

    paused, resumed = asyncio.run(main())
    assert paused.reason is TerminalReason.APPROVAL_REQUIRED
    assert resumed.reason is TerminalReason.COMPLETED


def test_a_sleeping_run_is_woken_early_from_asyncio(tmp_path: Path) -> None:
    until = (datetime.now(UTC) + timedelta(days=1)).isoformat()

    def agent() -> Agent:
        script: list[dict[str, Any]] = [
            {"kind": "wait", "reason": "tomorrow", "until": until},
            {"kind": "final", "answer": "done"},
        ]
        return Agent("waiter", ScriptedModel(script), tools=[])

    async def main() -> tuple[Outcome, bool, Outcome]:
        async with asyncio.timeout(TIMEOUT_S), AsyncioRuntime(db(tmp_path)) as runtime:
            slept = await runtime.run(agent(), "wait", invocation_id="w")
            early = await runtime.wake("w", by="ann")
            return slept, early, await runtime.resume("w", agent())

    slept, early, resumed = asyncio.run(main())
    assert slept.reason is TerminalReason.SLEEPING
    assert early
    assert resumed.reason is TerminalReason.COMPLETED
