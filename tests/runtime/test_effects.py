"""Write tools, the effect ledger and reconciliation, through the public API."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from aggregates.effect import Effect as LedgerEntry
from aggregates.effect import effect_key
from aggregates.invocation import BatchDispatched
from loop_actors import (
    Agent,
    CatalogueChangedError,
    EffectStatus,
    ErrorClass,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolContext,
    ToolDefinitionError,
    tool,
)
from loop_actors.store.store import EventStore
from tests.support.replies import FINAL, calls
from tests.support.runs import results_of, run


@pytest.fixture
def db_url(store_url: str) -> str:
    """This module's stores: each test runs on a SQLite file and on PostgreSQL."""
    return store_url


class FakeService:
    """An owning service in memory: receipts by key, with switches for failures."""

    def __init__(self) -> None:
        self.receipts: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, int]] = []
        self.reachable = True
        self.lose_next_reply = False
        self.hang_after_commit = False
        self.refuse: set[str] = set()
        self.first_request = trio.Event()

    def write(self, context: ToolContext, what: str) -> dict[str, Any]:
        assert context.effect_key is not None
        self.requests.append((context.effect_key, context.attempt))
        self.first_request.set()
        if not self.reachable:
            raise ConnectionError("service down")
        if what in self.refuse:
            from loop_actors import ToolError

            raise ToolError(f"{what} is not allowed", error_class=ErrorClass.REJECTED)
        self.receipts.setdefault(context.effect_key, {"what": what, "receipt": len(self.receipts)})
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise TimeoutError("reply lost")
        return self.receipts[context.effect_key]

    def reconcile(self, key: str) -> Reconciled:
        if not self.reachable:
            raise ConnectionError("service down")
        if key in self.receipts:
            return Reconciled(status="committed", receipt=self.receipts[key])
        return Reconciled(status="not_found")


def write_agent(service: FakeService, script: list[Any], **tool_options: Any) -> Agent:
    @tool(effect="write", reconcile=service.reconcile, **tool_options)
    async def record(what: str, context: ToolContext) -> dict[str, Any]:
        """Record something at the service."""
        if service.hang_after_commit:
            service.write(context, what)
            await trio.sleep_forever()
        return service.write(context, what)

    @tool
    async def look(key: str) -> str:
        """Read something."""
        return key

    return Agent("writer", ScriptedModel(script), [record, look])


def test_the_context_parameter_is_not_part_of_the_schema_the_model_sees() -> None:
    service = FakeService()
    agent = write_agent(service, [])
    schema = agent.toolbox.tools["record"].schema
    assert list(schema["properties"]) == ["what"]


def test_a_read_tool_cannot_declare_reconcile() -> None:
    with pytest.raises(ToolDefinitionError):
        tool(name="read", reconcile=lambda key: Reconciled(status="not_found"))(lambda key: key)


async def test_a_write_gets_a_stable_effect_key_derived_from_invocation_step_and_call() -> None:
    service = FakeService()
    outcome, events = await run(
        write_agent(service, [calls(("w1", "record", {"what": "x"})), FINAL])
    )
    assert outcome.reason is TerminalReason.COMPLETED
    expected = effect_key("inv", 1, "w1")
    assert service.requests == [(expected, 1)]
    (dispatched,) = [e for e in events if isinstance(e, BatchDispatched)]
    assert dispatched.calls[0].effect_key == expected
    (result,) = results_of(events)
    assert (result.effect_key, result.effect_status) == (expected, EffectStatus.COMMITTED)


async def test_the_same_call_id_in_two_steps_gets_two_keys() -> None:
    service = FakeService()
    script = [calls(("w", "record", {"what": "a"})), calls(("w", "record", {"what": "b"})), FINAL]
    await run(write_agent(service, script))
    assert len({key for key, _ in service.requests}) == 2
    assert len(service.receipts) == 2


async def test_writes_run_one_at_a_time_in_the_order_given_and_reads_together(
    clock: trio.testing.MockClock,
) -> None:
    order: list[str] = []

    @tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"))
    async def write(name: str) -> str:
        """A write that takes a while."""
        order.append(f"start {name}")
        await trio.sleep(1)
        order.append(f"end {name}")
        return name

    @tool
    async def read(name: str) -> str:
        """A read that takes a while."""
        order.append(f"start {name}")
        await trio.sleep(1)
        order.append(f"end {name}")
        return name

    batch = calls(
        ("r1", "read", {"name": "r1"}),
        ("r2", "read", {"name": "r2"}),
        ("w1", "write", {"name": "w1"}),
        ("w2", "write", {"name": "w2"}),
    )
    outcome, events = await run(Agent("a", ScriptedModel([batch, FINAL]), [read, write]))
    assert outcome.reason is TerminalReason.COMPLETED
    # The reads overlap (trio starts them in no set order); the writes follow, one by one.
    assert sorted(order[:2]) == ["start r1", "start r2"]
    assert sorted(order[2:4]) == ["end r1", "end r2"]
    assert order[4:] == ["start w1", "end w1", "start w2", "end w2"]
    (dispatched,) = [e for e in events if isinstance(e, BatchDispatched)]
    assert dispatched.plan == [["r1", "r2"], ["w1"], ["w2"]]


async def test_a_write_declared_commuting_runs_with_the_reads() -> None:
    @tool(effect="write", commutes=True)
    async def log(line: str) -> str:
        """Append a line to a log nobody reads in this batch."""
        return line

    @tool
    async def read(name: str) -> str:
        """Read."""
        return name

    batch = calls(("r1", "read", {"name": "a"}), ("l1", "log", {"line": "x"}))
    _, events = await run(Agent("a", ScriptedModel([batch, FINAL]), [read, log]))
    (dispatched,) = [e for e in events if isinstance(e, BatchDispatched)]
    assert dispatched.plan == [["r1", "l1"]]


async def test_a_write_whose_reply_is_lost_is_reconciled_and_not_retried() -> None:
    service = FakeService()
    service.lose_next_reply = True
    outcome, events = await run(
        write_agent(service, [calls(("w1", "record", {"what": "x"})), FINAL])
    )
    assert outcome.reason is TerminalReason.COMPLETED
    assert len(service.requests) == 1
    (result,) = results_of(events)
    assert result.effect_status is EffectStatus.RECONCILED
    assert result.output == service.receipts[result.effect_key]


async def test_a_write_that_times_out_after_committing_is_outcome_unknown_then_reconciled(
    clock: trio.testing.MockClock,
) -> None:
    service = FakeService()
    service.hang_after_commit = True
    agent = write_agent(service, [calls(("w1", "record", {"what": "x"})), FINAL], timeout_s=5)
    outcome, events = await run(agent)
    assert outcome.reason is TerminalReason.COMPLETED
    assert len(service.requests) == 1
    (result,) = results_of(events)
    assert result.effect_status is EffectStatus.RECONCILED
    assert result.ok


async def test_not_found_dispatches_again_with_the_same_key(db_url: str) -> None:
    service = FakeService()
    service.reachable = False
    agent = write_agent(service, [calls(("w1", "record", {"what": "x"})), FINAL])
    paused, _ = await run(agent, db_url)
    assert paused.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert paused.exit_code == 3

    service.reachable = True
    async with Runtime(db_url) as runtime:
        resumed = await runtime.resume("inv", agent)
        events = await runtime.history("inv")
    assert resumed.reason is TerminalReason.COMPLETED
    key = effect_key("inv", 1, "w1")
    assert service.requests == [(key, 1), (key, 2)]
    assert len(service.receipts) == 1
    ledger = EventStore(db_url).get_effect(key)
    assert ledger is not None
    assert (ledger.status, ledger.attempt) == (EffectStatus.COMMITTED, 2)
    assert results_of(events)[0].effect_status is EffectStatus.COMMITTED


async def test_a_rejected_write_is_an_error_result_and_the_effect_is_rejected(db_url: str) -> None:
    service = FakeService()
    service.refuse.add("forbidden")
    agent = write_agent(service, [calls(("w1", "record", {"what": "forbidden"})), FINAL])
    outcome, events = await run(agent, db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = results_of(events)
    assert result.error is not None
    assert result.effect_status is EffectStatus.REJECTED
    ledger = EventStore(db_url).get_effect(result.effect_key)
    assert ledger is not None
    assert ledger.status is EffectStatus.REJECTED


async def test_a_write_without_reconcile_whose_outcome_is_unknown_pauses() -> None:
    @tool(effect="write")
    async def fire(what: str) -> str:
        """Fire and lose the reply."""
        raise TimeoutError("no reply")

    outcome, _ = await run(Agent("a", ScriptedModel([calls(("f", "fire", {"what": "x"}))]), [fire]))
    assert outcome.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert outcome.detail is not None
    assert "no reconcile function" in outcome.detail


async def test_cancel_while_a_slow_write_runs_leaves_its_effect_open_for_the_sweeper(
    db_url: str,
) -> None:
    service = FakeService()
    service.hang_after_commit = True
    agent = write_agent(service, [calls(("w1", "record", {"what": "x"}))])
    async with Runtime(db_url) as runtime:
        async with trio.open_nursery() as nursery:
            outcomes: list[Any] = []

            async def go() -> None:
                outcomes.append(await runtime.run(agent, "g", invocation_id="inv"))

            nursery.start_soon(go)
            with trio.fail_after(10):
                await service.first_request.wait()
            assert runtime.cancel("inv")
        assert outcomes[0].reason is TerminalReason.CANCELLED
        events = await runtime.history("inv")
        (result,) = results_of(events)
        assert result.effect_status is EffectStatus.OUTCOME_UNKNOWN
        key = effect_key("inv", 1, "w1")
        report = await runtime.reconcile(agent)
    assert report.effects_settled == 1
    assert report.effects_open == 0
    ledger = EventStore(db_url).get_effect(key)
    assert ledger is not None
    assert ledger.status is EffectStatus.RECONCILED


async def test_resuming_a_finished_invocation_returns_its_outcome_and_runs_nothing(
    db_url: str,
) -> None:
    service = FakeService()
    agent = write_agent(service, [calls(("w1", "record", {"what": "x"})), FINAL])
    first, events = await run(agent, db_url)
    again = await Runtime(db_url).resume("inv", agent)
    assert again == first
    assert len(service.requests) == 1
    assert len(await Runtime(db_url).history("inv")) == len(events)


async def test_resuming_with_another_agent_is_refused(db_url: str) -> None:
    from loop_actors import UsageError

    service = FakeService()
    await run(write_agent(service, [FINAL]), db_url)
    with pytest.raises(UsageError):
        await Runtime(db_url).resume("inv", Agent("other", ScriptedModel([FINAL])))


def test_the_ledger_refuses_an_outcome_for_a_write_that_was_not_dispatched() -> None:
    from datetime import UTC, datetime

    from aggregates import IllegalTransitionError

    at = datetime(2026, 1, 1, tzinfo=UTC)
    entry = LedgerEntry.prepare(
        invocation_id="i", step=1, call_id="c", tool="t", arguments_digest="d", at=at
    )
    with pytest.raises(IllegalTransitionError):
        entry.commit({"r": 1}, at=at)
    entry.dispatch(at=at)
    entry.mark_unknown("timeout", at=at)
    with pytest.raises(IllegalTransitionError):
        entry.commit({"r": 1}, at=at)
    assert entry.is_open


async def test_a_tool_error_from_a_write_is_a_rejection_not_an_unknown_outcome(db_url: str) -> None:
    from loop_actors import ToolError

    @tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"))
    async def reserve(seat: str) -> str:
        """Reserve a seat (always taken)."""
        raise ToolError(f"seat {seat} is taken")

    agent = Agent("a", ScriptedModel([calls(("r", "reserve", {"seat": "1A"})), FINAL]), [reserve])
    outcome, events = await run(agent, db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = results_of(events)
    assert result.effect_status is EffectStatus.REJECTED
    assert result.error is not None
    assert "taken" in result.error.message


async def test_a_write_whose_output_cannot_be_stored_is_still_committed(db_url: str) -> None:
    @tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"))
    async def send(text: str) -> object:
        """Send, returning something JSON cannot hold."""
        return object()

    agent = Agent("a", ScriptedModel([calls(("s", "send", {"text": "hi"})), FINAL]), [send])
    _, events = await run(agent, db_url)
    (result,) = results_of(events)
    assert result.effect_status is EffectStatus.COMMITTED
    assert result.error is not None
    assert result.error.error_class is ErrorClass.OUTPUT_INVALID
    ledger = EventStore(db_url).get_effect(result.effect_key)
    assert ledger is not None
    assert ledger.status is EffectStatus.COMMITTED


async def test_a_service_that_never_knows_the_key_pauses_after_three_dispatches(
    db_url: str,
) -> None:
    attempts: list[int] = []

    @tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"))
    async def flaky(text: str, context: ToolContext) -> str:
        """Always lose the connection before the service sees it."""
        attempts.append(context.attempt)
        raise ConnectionError("reset")

    agent = Agent("a", ScriptedModel([calls(("f", "flaky", {"text": "x"})), FINAL]), [flaky])
    outcome, _ = await run(agent, db_url)
    assert outcome.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert attempts == [1, 2, 3]
    ledger = EventStore(db_url).get_effect(effect_key("inv", 1, "f"))
    assert ledger is not None
    assert ledger.attempt == 3  # no dispatch is recorded that did not run


async def test_resuming_with_a_removed_tool_when_allowed_settles_its_pending_calls(
    db_url: str,
) -> None:
    service = FakeService()
    service.reachable = False
    agent = write_agent(
        service,
        [calls(("l", "look", {"key": "a"}), ("w1", "record", {"what": "x"})), FINAL],
    )
    paused, _ = await run(agent, db_url)
    assert paused.reason is TerminalReason.RECONCILIATION_REQUIRED

    @tool
    async def look(key: str) -> str:
        """Read something."""
        return key

    reduced = Agent("writer", ScriptedModel([calls(("l", "look", {"key": "a"})), FINAL]), [look])
    async with Runtime(db_url) as runtime:
        with pytest.raises(CatalogueChangedError):
            await runtime.resume("inv", reduced)
        again = await runtime.resume("inv", reduced, allow_catalogue_change=True)
    assert again.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert again.detail is not None
    assert "record" in again.detail
