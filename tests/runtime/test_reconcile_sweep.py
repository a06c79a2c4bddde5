"""The sweep resumes every invocation of its agent paused ``reconciliation_required`` (issue 33 C).

Not only those with an open effect: a write dispatched until the pause's bound ends
``prepared`` (its service answered "not found" each time), and a write settled by hand
is not open either; both invocations used to stay paused for ever. The sweep reports
how many of the agent's invocations still wait (``invocations_waiting``).

Bad inputs tried: a service that keeps losing every request (the invocation pauses
again and is counted as waiting), another agent's paused invocation (left alone, not
counted).
"""

from __future__ import annotations

import pytest
import trio

from aggregates.decisions import EffectStatus
from aggregates.effect import effect_key
from loop_actors import (
    EventStore,
    Runtime,
    TerminalReason,
)
from tests.support.effects import INVOCATION, Relay, api_agent, paused_run


@pytest.fixture
def db_url(store_url: str) -> str:
    """Each test runs on a SQLite file and on PostgreSQL."""
    return store_url


async def test_a_write_its_service_never_saw_is_resumed_by_the_sweep_until_it_completes(
    db_url: str,
) -> None:
    relay = Relay()
    agent = relay.agent()
    key = effect_key("lost", 1, "s1")
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            paused = await runtime.run(agent, "say hello", invocation_id="lost")
            assert paused.reason is TerminalReason.RECONCILIATION_REQUIRED
            effect = EventStore(db_url).get_effect(key)
            assert effect is not None
            assert effect.status is EffectStatus.PREPARED  # not open: no effect waits

            still_lost = await runtime.reconcile(agent)
            relay.losing = False
            swept = await runtime.reconcile(agent)
            after = await runtime.reconcile(agent)
    assert [o.reason for o in still_lost.resumed] == [TerminalReason.RECONCILIATION_REQUIRED]
    assert (still_lost.invocations_waiting, still_lost.effects_open) == (1, 0)
    assert [(o.invocation_id, o.reason) for o in swept.resumed] == [
        ("lost", TerminalReason.COMPLETED)
    ]
    assert swept.invocations_waiting == 0
    assert (after.resumed, after.invocations_waiting) == ([], 0)
    assert (relay.sent, relay.requests) == ({key: "hello"}, 1)


async def test_an_invocation_whose_write_was_settled_by_hand_is_resumed_by_the_sweep(
    db_url: str,
) -> None:
    agent = api_agent([])
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await paused_run(runtime, agent)
            await runtime.resolve_effect(
                effect_key(INVOCATION, 1, "w1"), committed=True, receipt={"id": 1}, by="alice"
            )
            report = await runtime.reconcile(agent)
    assert [(o.invocation_id, o.reason) for o in report.resumed] == [
        (INVOCATION, TerminalReason.COMPLETED)
    ]
    assert (report.effects_open, report.invocations_waiting) == (0, 0)


async def test_another_agents_paused_invocation_is_neither_resumed_nor_counted(
    db_url: str,
) -> None:
    relay = Relay()
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await runtime.run(relay.agent("relay"), "say hello", invocation_id="lost")
            relay.losing = False
            report = await runtime.reconcile(relay.agent("other"))
            outcome = await runtime.resume("lost", relay.agent("relay"))
    assert (report.resumed, report.invocations_waiting) == ([], 0)
    assert outcome.reason is TerminalReason.COMPLETED


async def test_a_sweep_given_invocation_ids_resumes_only_those(db_url: str) -> None:
    """The console's bulk reconcile over a filter: the others stay paused, untouched."""
    relay = Relay()
    agent = relay.agent()
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            for invocation_id in ("lost-1", "lost-2"):
                paused = await runtime.run(agent, "say hello", invocation_id=invocation_id)
                assert paused.reason is TerminalReason.RECONCILIATION_REQUIRED
            relay.losing = False
            only_one = await runtime.reconcile(agent, invocation_ids=["lost-1"])
            left = await runtime.load("lost-2")
            none = await runtime.reconcile(agent, invocation_ids=[])
    assert [(o.invocation_id, o.reason) for o in only_one.resumed] == [
        ("lost-1", TerminalReason.COMPLETED)
    ]
    assert left.paused_for_reconciliation
    assert none.resumed == []
