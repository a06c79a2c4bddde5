"""Bulk resume and reconcile over a filter, over HTTP: a dry run, then a typed confirmation.

On SQLite and PostgreSQL (``store_url``). The console resumes and reconciles with the
agents it serves (``serve_console(agents=...)``, ``serve --agent``). Bad inputs tried: a
bulk resume or reconcile of a console that serves no agent (409 ``no_agent``), a dry
run without the token (401), a confirmation with another count (409), an unknown bulk
action (404), a filter that is not the list's (400); invocations a resume would not
drive (waiting for an approval, an answer, a child's person; asleep; another agent's;
held by a live lease), each skipped with its reason.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from loop_actors import Runtime, TerminalReason
from loop_actors.console import bulk
from tests.support.console import (
    asker,
    bearer,
    client,
    completed_refund,
    delegating_root,
    event_types,
    gated_agent,
    paused_refund,
    refunds,
    serving,
    sleeper,
)
from tests.support.effects import Relay, api_agent, paused_run


async def _histories(db_url: str, ids: list[str]) -> dict[str, list[str]]:
    return {invocation_id: await event_types(db_url, invocation_id) for invocation_id in ids}


async def test_a_bulk_resume_dry_run_changes_nothing_and_says_which_are_eligible(
    store_url: str,
) -> None:
    relay = Relay()
    lost = relay.agent()
    with trio.fail_after(60):
        async with Runtime(store_url) as runtime:
            paused = await runtime.run(lost, "say hello", invocation_id="lost-1")
            assert paused.reason is TerminalReason.RECONCILIATION_REQUIRED
            await runtime.submit(lost, "say hello again", invocation_id="queued-1")
            await runtime.submit(refunds, "refund B-2", invocation_id="refund-9")
            asked = await runtime.run(asker, "help me", invocation_id="ask-1")
            assert asked.reason is TerminalReason.CLARIFICATION_REQUIRED
            slept = await runtime.run(sleeper, "buy bread", invocation_id="sleep-1")
            assert slept.reason is TerminalReason.SLEEPING
        await paused_refund(store_url, "refund-1")
        await completed_refund(store_url, "refund-done")
        ids = ["lost-1", "queued-1", "refund-9", "ask-1", "sleep-1", "refund-1", "refund-done"]
        before = await _histories(store_url, ids)
        async with serving(store_url, agents=[lost, asker, sleeper]) as base:
            async with client(base) as anonymous:
                no_token = await anonymous.post("/api/bulk/resume", json={"where": {}})
            async with client(base, headers=bearer()) as http:
                dry = await http.post("/api/bulk/resume", json={"where": {}})
                after_dry = await _histories(store_url, ids)
                wrong = await http.post(
                    "/api/bulk/resume",
                    json={"where": {}, "dry_run": False, "by": "ops", "confirm": "resume 3"},
                )
                after_wrong = await _histories(store_url, ids)
                relay.losing = False
                done = await http.post(
                    "/api/bulk/resume",
                    json={"where": {}, "dry_run": False, "by": "ops", "confirm": "resume 2"},
                )
                again = await http.post("/api/bulk/resume", json={"where": {}})
    assert no_token.status_code == 401
    answer = dry.json()
    assert (answer["dry_run"], answer["matched"], answer["confirm"]) == (True, 2, "resume 2")
    assert answer["invocation_ids"] == ["queued-1", "lost-1"]  # newest first
    skipped = {s["invocation_id"]: s["why"] for s in answer["skipped"]}
    assert skipped == {
        "refund-1": "waits_for_approval",
        "sleep-1": "not_due",
        "ask-1": "waits_for_answer",
        "refund-9": "agent_not_served",
    }
    details = {s["invocation_id"]: s["detail"] for s in answer["skipped"]}
    assert "loop-actors wake sleep-1" in details["sleep-1"]
    assert "serve --agent" in details["refund-9"]
    assert after_dry == before
    assert wrong.status_code == 409
    assert wrong.json()["error"] == "confirmation_mismatch"
    assert after_wrong == before
    assert done.status_code == 200, done.text
    assert done.json()["results"] == {"queued-1": "completed", "lost-1": "completed"}
    assert again.json()["matched"] == 0
    after = await _histories(store_url, ids)
    for unchanged in ("refund-9", "ask-1", "sleep-1", "refund-1", "refund-done"):
        assert after[unchanged] == before[unchanged], unchanged


async def test_a_bulk_reconcile_settles_what_the_filter_matches_with_the_sweep(
    store_url: str,
) -> None:
    relay = Relay()
    lost = relay.agent()
    writer = api_agent([])
    with trio.fail_after(60):
        async with Runtime(store_url) as runtime:
            for invocation_id in ("lost-1", "lost-2"):
                paused = await runtime.run(lost, "say hello", invocation_id=invocation_id)
                assert paused.reason is TerminalReason.RECONCILIATION_REQUIRED
            await paused_run(runtime, writer)  # inv-1: its write's outcome is unknown
            # Its calls that started children are open: it waits for a child's person.
            await runtime.run(delegating_root, "pay big", invocation_id="root-1")
        await paused_refund(store_url, "refund-1")  # nothing to reconcile
        relay.losing = False
        async with (
            serving(store_url, agents=[lost, writer]) as base,
            client(base, headers=bearer()) as http,
        ):
            one = {"where": {"id": "lost-1"}}
            dry_one = await http.post("/api/bulk/reconcile", json=one)
            lost_2_before = await event_types(store_url, "lost-2")
            done_one = await http.post(
                "/api/bulk/reconcile",
                json={**one, "dry_run": False, "by": "ops", "confirm": "reconcile 1"},
            )
            lost_2_after = await event_types(store_url, "lost-2")
            dry_all = await http.post("/api/bulk/reconcile", json={"where": {}})
            done_all = await http.post(
                "/api/bulk/reconcile",
                json={"where": {}, "dry_run": False, "by": "ops", "confirm": "reconcile 2"},
            )
            inv = (await http.get("/api/invocations/lost-2")).json()
    assert dry_one.json()["invocation_ids"] == ["lost-1"]
    assert done_one.json()["results"] == {"lost-1": "completed"}
    assert lost_2_after == lost_2_before  # not matched: not swept
    assert dry_all.json()["invocation_ids"] == ["inv-1", "lost-2"]
    skipped = {(s["invocation_id"], s["why"]) for s in dry_all.json()["skipped"]}
    assert ("root-1", "waits_for_child") in skipped
    assert {why for _, why in skipped} == {"waits_for_child"}  # root-1 and its middle child
    results = done_all.json()["results"]
    assert results == {"inv-1": "needs_person", "lost-2": "completed"}
    assert "no reconcile function" in done_all.json()["details"]["inv-1"]
    assert inv["status"] == "terminated"


async def test_bulk_resume_and_reconcile_need_an_agent_and_a_known_action(
    store_url: str,
) -> None:
    await paused_refund(store_url, "refund-1")
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base, headers=bearer()) as http:
            resume = await http.post("/api/bulk/resume", json={"where": {}})
            reconcile = await http.post(
                "/api/bulk/reconcile",
                json={"where": {}, "dry_run": False, "by": "ops", "confirm": "reconcile 0"},
            )
            unknown = await http.post("/api/bulk/retry", json={"where": {}})
            bad_filter = await http.post("/api/bulk/cancel", json={"where": {"status": "asleep"}})
    for refused in (resume, reconcile):
        assert refused.status_code == 409
        assert refused.json()["error"] == "no_agent"
        assert "serve --agent MODULE:ATTR" in refused.json()["detail"]
    assert unknown.status_code == 404
    assert bad_filter.status_code == 400


async def test_a_resumed_run_is_not_cancelled_when_the_console_stops(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped mid-run, the console abandons it: nothing is recorded; a resume goes on."""
    monkeypatch.setattr(bulk, "ANSWER_WAIT_S", 0.2)
    gates = [trio.Event()]
    gated = gated_agent(gates)
    with trio.fail_after(60):
        async with Runtime(store_url) as runtime:
            await runtime.submit(gated, "pass the gate", invocation_id="gated-1")
        async with (
            serving(store_url, agents=[gated]) as base,
            client(base, headers=bearer()) as http,
        ):
            started = await http.post(
                "/api/bulk/resume",
                json={"where": {}, "dry_run": False, "by": "ops", "confirm": "resume 1"},
            )
            # The run is the console's: the test sees its commits in the store.
            while "BatchDispatched" not in await event_types(store_url, "gated-1"):  # noqa: ASYNC110
                await trio.sleep(0.05)
            busy = await http.post("/api/bulk/resume", json={"where": {}})
        stopped = await event_types(store_url, "gated-1")
        gates[0].set()
        async with Runtime(store_url) as runtime:
            done = await runtime.resume("gated-1", gated)
    assert started.json()["results"] == {"gated-1": "running"}
    skipped: list[dict[str, Any]] = busy.json()["skipped"]
    assert [(s["invocation_id"], s["why"]) for s in skipped] == [("gated-1", "lease_held")]
    assert "Terminated" not in stopped
    assert stopped[-1] == "BatchDispatched"
    assert done.reason is TerminalReason.COMPLETED
