"""The metrics of this process's machinery: Journal transactions and the leases held.

Not derived from the history (they are about this process, not the run): each
Journal transaction is one point of ``loop_actors.journal.transaction.events`` and of
``.duration``, and ``loop_actors.leases.held`` is observed when the SDK collects. With
the SDK's in-memory reader, on SQLite and PostgreSQL. Bad input tried: a meter
provider installed after the Runtime opened (the leases are still observed at the next
report).
"""

from __future__ import annotations

from typing import Any

import trio

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, tool
from tests.support.telemetry import Captured, in_memory_telemetry

EVENTS = "loop_actors.journal.transaction.events"
DURATION = "loop_actors.journal.transaction.duration"
LEASES = "loop_actors.leases.held"


def _agent(
    during: list[dict[str, list[tuple[dict[str, Any], float, int]]]], captured: Captured | None
) -> Agent:
    @tool
    def look(order_id: str) -> str:
        """Look an order up (and note what the metrics say meanwhile)."""
        if captured is not None:
            during.append(captured.metrics())
        return f"{order_id}: shipped"

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            call = {"id": "c1", "name": "look", "arguments": {"order_id": "A-1"}}
            return {"kind": "tool_calls", "calls": [call]}
        return {"kind": "final", "answer": "shipped"}

    return Agent("orders", ScriptedModel(decide), [look])


def _leases_by_kind(
    metrics: dict[str, list[tuple[dict[str, Any], float, int]]],
) -> dict[str, float]:
    return {a["loop_actors.holder.kind"]: value for a, value, _ in metrics[LEASES]}


async def test_each_journal_transaction_is_one_point_of_size_and_duration(store_url: str) -> None:
    kind = "postgresql" if store_url.startswith("postgresql") else "sqlite"
    with in_memory_telemetry(metrics_only=True) as captured, trio.fail_after(30):
        async with Runtime(store_url) as runtime:
            await runtime.run(_agent([], None), "where is A-1?", invocation_id="o-1")
            journal = runtime.statistics().journal
            assert journal is not None
        metrics = captured.metrics()
    sizes, durations = metrics[EVENTS], metrics[DURATION]
    assert {a["db.system.name"] for a, _, _ in sizes + durations} == {kind}
    assert sum(count for _, _, count in sizes) == journal.transactions
    assert sum(count for _, _, count in durations) == journal.transactions
    assert sum(total for _, total, _ in sizes) == journal.events_written
    assert all(total > 0 for _, total, _ in durations)


async def test_the_leases_held_are_observed_while_a_run_holds_one(db_url: str) -> None:
    during: list[dict[str, list[tuple[dict[str, Any], float, int]]]] = []
    with in_memory_telemetry(metrics_only=True) as captured, trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await runtime.run(_agent(during, captured), "where is A-1?", invocation_id="o-1")
            after = captured.metrics()
    [inside] = during
    assert _leases_by_kind(inside) == {"run": 1.0, "worker": 0.0}
    assert _leases_by_kind(after) == {"run": 0.0, "worker": 0.0}


async def test_a_meter_provider_installed_after_the_runtime_opened_still_sees_the_leases(
    db_url: str,
) -> None:
    during: list[dict[str, list[tuple[dict[str, Any], float, int]]]] = []
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await runtime.run(_agent([], None), "first", invocation_id="o-0")  # no SDK: nothing
            with in_memory_telemetry(metrics_only=True) as captured:
                agent = _agent(during, captured)
                await runtime.run(agent, "where is A-1?", invocation_id="o-1")
                await runtime.run(agent, "and now?", invocation_id="o-2")
    # The first run's report made the gauge; the second run is observed holding its lease.
    assert _leases_by_kind(during[-1])["run"] == 1.0
