"""``GET /api/invocations/{id}/tree/events``: a parent and its children in one resumable stream.

The boss delegates to two payer children in one batch (``tests/support/children_app``),
on SQLite and PostgreSQL.
Bad inputs tried: an unknown root, a malformed ``Last-Event-ID``.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest
import trio

from loop_actors import Runtime
from loop_actors.store.history_records import history_records
from loop_actors.store.store import EventStore
from tests.support.children_app import BOSS
from tests.support.console import client, server_sent, serving


async def _tree(db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges"))
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(BOSS, "pay both", invocation_id="boss")
    assert outcome.answer == "both paid"


def _records(db: str, invocation_id: str) -> list[dict[str, object]]:
    store = EventStore(db, create=False)
    try:
        return history_records(store, invocation_id)
    finally:
        store.close()


async def _stream(http: httpx2.AsyncClient, after: str | None = None) -> list[dict[str, str]]:
    headers = {} if after is None else {"Last-Event-ID": after}
    got = []
    async with http.stream("GET", "/api/invocations/boss/tree/events", headers=headers) as s:
        assert s.status_code == 200
        async for event in server_sent(s):
            got.append(event)
    return got


async def test_the_tree_stream_holds_the_parent_and_its_children_once_each(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = store_url
    await _tree(db, tmp_path, monkeypatch)
    with trio.fail_after(30):
        async with serving(db) as base, client(base) as http:
            whole = await _stream(http)
            middle = whole[len(whole) // 2]["id"]
            rest = await _stream(http, after=middle)
            unknown = await http.get("/api/invocations/nobody/tree/events")
            malformed = await http.get(
                "/api/invocations/boss/tree/events", headers={"Last-Event-ID": "x"}
            )
    records = [json.loads(event["data"]) for event in whole]
    members = {record["invocation_id"] for record in records}
    assert len(members) == 3  # the boss and its two payers
    for member in members:  # each invocation's events, all of them, in its own order
        assert [r for r in records if r["invocation_id"] == member] == _records(db, member)
    ids = [int(event["id"]) for event in whole]
    assert ids == sorted(set(ids))  # log order, each once
    assert records[-1]["invocation_id"] == "boss"
    assert records[-1]["type"] == "Terminated"
    assert rest == whole[len(whole) // 2 + 1 :]
    assert unknown.status_code == 404
    assert malformed.status_code == 400
