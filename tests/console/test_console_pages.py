"""The invocation page's lanes and compactions, the inbox's requesting path, the bulk form.

On SQLite and PostgreSQL (``store_url``), over HTTP against a real server: the JSON API
(``batches``, ``compactions``, ``waits_for_child``, an approval's ``path``) and the
pages drawn from it.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.handoffs import handoff_id_of
from aggregates.invocation import ContextCompacted
from loop_actors import Agent, Budget, ModelRequest, Runtime, ScriptedModel, TerminalReason, tool
from tests.support.children_app import TRIAGE
from tests.support.console import client, delegating_root, paused_refund, serving


@tool
def look(page: int) -> str:
    """Read a page of the manual."""
    return f"page {page}: " + "lorem ipsum " * 20


@tool(effect="write")
def note(text: str) -> str:
    """Write a note (a write: a group of its own in its batch)."""
    return f"noted {text}"


def _reads(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        calls = [
            {"id": "a", "name": "look", "arguments": {"page": 1}},
            {"id": "b", "name": "look", "arguments": {"page": 2}},
            {"id": "w", "name": "note", "arguments": {"text": "started"}},
        ]
        return {"kind": "tool_calls", "calls": calls}
    if request.step <= 6:
        call = {"id": f"p{request.step}", "name": "look", "arguments": {"page": request.step}}
        return {"kind": "tool_calls", "calls": [call]}
    return {"kind": "final", "answer": "read"}


reader = Agent(
    "reader",
    ScriptedModel(_reads),
    tools=[look, note],
    budget=Budget(max_repeated_plan=10),
    context_limit=1500,
    keep_recent_turns=2,
)
"""Two reads and a write in one batch, then a page a step: its view is compacted."""


async def test_a_batchs_parallel_calls_are_drawn_in_lanes_and_compactions_are_marked(
    store_url: str,
) -> None:
    with trio.fail_after(60):
        async with Runtime(store_url) as runtime:
            done = await runtime.run(reader, "read the manual", invocation_id="reader-1")
            assert done.reason is TerminalReason.COMPLETED
            compacted = [
                e for e in await runtime.history("reader-1") if isinstance(e, ContextCompacted)
            ]
        async with serving(store_url) as base, client(base) as http:
            shown = (await http.get("/api/invocations/reader-1")).json()
            page = await http.get("/invocations/reader-1")
    (batch,) = shown["batches"]  # one step with more than one call
    assert batch["step"] == 1
    assert batch["plan"] == [["a", "b"], ["w"]]
    lanes = {lane["call_id"]: lane for lane in batch["lanes"]}
    assert (lanes["a"]["group"], lanes["b"]["group"], lanes["w"]["group"]) == (0, 0, 1)
    assert lanes["a"]["start_ms"] == lanes["b"]["start_ms"] == 0  # side by side
    slowest = max(lanes["a"]["duration_ms"], lanes["b"]["duration_ms"])
    assert lanes["w"]["start_ms"] == slowest  # after its group's slowest call
    assert compacted, "the agent's view was never compacted"
    assert [c["step"] for c in shown["compactions"]] == [e.step for e in compacted]
    assert shown["compactions"][0]["dropped_steps"] == compacted[0].dropped_steps
    assert page.status_code == 200
    assert 'id="lanes-1"' in page.text
    assert page.text.count('<rect class="lane') == 3
    assert page.text.count('<p class="compaction"') == len(compacted)
    assert f"before step {compacted[0].step}" in page.text


async def test_the_inbox_shows_the_requesting_path_from_the_root_each_id_a_link(
    store_url: str,
) -> None:
    with trio.fail_after(60):
        async with Runtime(store_url) as runtime:
            paused = await runtime.run(delegating_root, "pay big", invocation_id="root-1")
        assert paused.path is not None
        async with serving(store_url) as base, client(base) as http:
            (item,) = (await http.get("/api/approvals")).json()["approvals"]
            inbox = await http.get("/approvals")
            root_page = await http.get("/invocations/root-1")
            root_shown = (await http.get("/api/invocations/root-1")).json()
    assert item["invocation_id"] == paused.path[-1]
    assert item["path"] == paused.path  # root-1 -> middle's child -> approver's child
    assert len(item["path"]) == 3
    for page in (inbox, root_page):
        for invocation_id in paused.path:
            assert f'<a href="/invocations/{invocation_id}">{invocation_id}</a>' in page.text
    assert " → " in inbox.text
    assert root_shown["waits_for_child"] == paused.path
    assert root_shown["waiting"] is None


async def test_the_list_offers_a_bulk_action_over_its_filter(store_url: str) -> None:
    await paused_refund(store_url)
    with trio.fail_after(30):
        async with serving(store_url) as base, client(base) as http:
            page = await http.get("/invocations?agent=refunds&status=paused&limit=5&offset=0")
            single = (await http.get("/api/invocations/refund-1")).json()
    assert page.status_code == 200
    where = page.text.split('data-where="', 1)[1].split('"', 1)[0]
    assert json.loads(html.unescape(where)) == {"agent": "refunds", "status": "paused"}
    for action in ("cancel", "resume", "reconcile"):
        assert f"<option>{action}</option>" in page.text
    assert 'id="bulk-apply"' in page.text
    assert single["batches"] == []  # one call: no lanes
    assert single["compactions"] == []


async def test_a_handoffs_source_and_target_link_to_each_other(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges.txt"))
    target = handoff_id_of("t")
    with trio.fail_after(60):
        async with Runtime(store_url) as runtime:
            assert (await runtime.run(TRIAGE, "my refund", invocation_id="t")).chain == [
                "t",
                target,
            ]
        async with serving(store_url) as base, client(base) as http:
            source = (await http.get("/api/invocations/t")).json()
            shown = (await http.get("/api/invocations/" + target)).json()
            source_page = await http.get("/invocations/t")
            target_page = await http.get("/invocations/" + target)
    assert (source["handed_off_to"], source["handed_off_from"]) == (target, None)
    assert (shown["handed_off_to"], shown["handed_off_from"]) == (None, "t")
    assert f'<dt>handed off to</dt><dd><a href="/invocations/{target}">' in source_page.text
    assert '<dt>handed off from</dt><dd><a href="/invocations/t">' in target_page.text
