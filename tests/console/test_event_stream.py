"""``GET /api/invocations/{id}/events`` over a real server while a run progresses.

A run whose tools wait on trio Events goes on in this process while the console (its
own runtime, the same store) streams it. Bad inputs tried: a ``Last-Event-ID`` that is
not a number, a negative one, one past the end, an unknown invocation.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from functools import partial
from typing import Any

import trio

from loop_actors import Runtime
from loop_actors.store.history_records import history_records
from loop_actors.store.store import EventStore
from tests.support.console import (
    DROPPED_STREAMS,
    client,
    completed_refund,
    gated_agent,
    server_sent,
    serving,
)

STEPS = 3


def _stored_records(db_url: str, invocation_id: str) -> list[dict[str, Any]]:
    store = EventStore(db_url, create=False)
    try:
        return history_records(store, invocation_id)
    finally:
        store.close()


async def _wait_for_events(runtime: Runtime, invocation_id: str, count: int) -> None:
    while True:
        try:
            if len(await runtime.history(invocation_id)) >= count:
                return
        except Exception as error:  # not started yet
            if type(error).__name__ != "InvocationNotFoundError":
                raise
        await trio.sleep(0.02)


@DROPPED_STREAMS
async def test_a_client_that_reconnects_with_last_event_id_gets_every_later_event_once(
    store_url: str,
) -> None:
    gates = [trio.Event() for _ in range(STEPS)]
    agent = gated_agent(gates)
    seen: list[dict[str, str]] = []
    with trio.fail_after(60):
        async with (
            serving(store_url) as base,
            Runtime(store_url) as runtime,
            client(base) as http,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(partial(runtime.run, agent, "pass the gates", invocation_id="gated"))
            await _wait_for_events(runtime, "gated", 3)  # started, decided, dispatched
            # The first connection: the events so far, then it drops mid-run.
            async with http.stream("GET", "/api/invocations/gated/events") as first:
                assert first.status_code == 200
                assert first.headers["content-type"].startswith("text/event-stream")
                async with aclosing(server_sent(first)) as events:
                    async for event in events:
                        seen.append(event)
                        if event["event"] == "BatchDispatched":
                            break
            dropped_at = int(seen[-1]["id"])
            # Meanwhile the run goes on: committed while no client listens.
            gates[0].set()
            gates[1].set()
            await _wait_for_events(runtime, "gated", dropped_at + 4)
            headers = {"Last-Event-ID": str(dropped_at)}
            async with (
                http.stream("GET", "/api/invocations/gated/events", headers=headers) as again,
                aclosing(server_sent(again)) as events,
            ):
                async for event in events:
                    seen.append(event)
                    record = json.loads(event["data"])
                    if event["event"] == "BatchDispatched" and record["data"]["step"] == STEPS:
                        gates[2].set()  # the stream is open while the run goes on
            # The server closed the stream after Terminated.
    stored = _stored_records(store_url, "gated")
    assert [int(event["id"]) for event in seen] == list(range(1, len(stored) + 1))
    assert [event["event"] for event in seen] == [record["type"] for record in stored]
    assert [json.loads(event["data"]) for event in seen] == stored
    assert seen[-1]["event"] == "Terminated"


async def test_the_data_is_the_line_history_json_prints(tmp_path: Any) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    await completed_refund(db, "done")
    with trio.fail_after(30):
        async with serving(db) as base, client(base) as http:
            whole = (await http.get("/api/invocations/done/events")).text
            resumed = await http.get("/api/invocations/done/events", headers={"Last-Event-ID": "6"})
            at_the_end = await http.get("/api/invocations/done/events?after=8")
    lines = [line[len("data: ") :] for line in whole.splitlines() if line.startswith("data: ")]
    assert lines == [
        json.dumps(record, ensure_ascii=False) for record in _stored_records(db, "done")
    ]
    assert [line for line in resumed.text.splitlines() if line.startswith("id:")] == [
        "id: 7",
        "id: 8",
    ]
    assert "data:" not in at_the_end.text  # it had ended: closed at once


async def test_a_bad_last_event_id_is_400(tmp_path: Any) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    await completed_refund(db, "done")
    async with serving(db) as base, client(base) as http:
        words = await http.get("/api/invocations/done/events", headers={"Last-Event-ID": "x"})
        negative = await http.get("/api/invocations/done/events?after=-1")
        past_the_end = await http.get("/api/invocations/done/events?after=99")
    assert words.status_code == 400
    assert negative.status_code == 400
    assert past_the_end.status_code == 200
    assert "data:" not in past_the_end.text
