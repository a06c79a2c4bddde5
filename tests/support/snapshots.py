"""A scripted run with every kind of turn, and the store of snapshots its code wrote.

``tests/fixtures/snapshots-main.sql`` was written by this module's ``main`` at
``cd3e3e6`` (before snapshots were read lazily; the module was ``tests/snapshot_support.py``
then): ``python -m tests.support.snapshots FILE``. It holds ``snap-done`` (completed) and ``snap-paused`` (paused for a
clarification), each with a snapshot after every few events.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from pathlib import Path
from typing import Any

import trio

from aggregates.events import fold
from loop_actors import Agent, ModelRequest, ScriptedModel, ToolContext, Usage, tool
from loop_actors.store.store import EventStore

SNAPSHOT_EVERY = 3
"""The fixture has a snapshot after every this many events of each invocation."""


@tool
async def lookup(key: str) -> dict[str, Any]:
    """Look up a value."""
    return {"key": key, "values": [1, 2.5, None, True, {"nested": "é"}]}


@tool
async def fail(reason: str) -> str:
    """Always fail."""
    raise RuntimeError(reason)


@tool(effect="write")
async def refund(amount: int, context: ToolContext) -> dict[str, Any]:
    """Refund an amount."""
    return {"receipt": f"r-{context.effect_key}", "amount": amount}


def decide(request: ModelRequest) -> dict[str, Any]:
    """Steps: a read, an unknown tool, a failing call, a write, two reads, a question, an answer."""
    script: dict[int, dict[str, Any]] = {
        1: {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "lookup", "arguments": {"key": "a"}}],
        },
        2: {"kind": "tool_calls", "calls": [{"id": "c2", "name": "nope", "arguments": {}}]},
        3: {
            "kind": "tool_calls",
            "calls": [{"id": "c3", "name": "fail", "arguments": {"reason": "x"}}],
        },
        4: {
            "kind": "tool_calls",
            "calls": [{"id": "c4", "name": "refund", "arguments": {"amount": 4}}],
        },
        5: {
            "kind": "tool_calls",
            "calls": [
                {"id": "c5", "name": "lookup", "arguments": {"key": "b"}},
                {"id": "c6", "name": "lookup", "arguments": {"key": "c"}},
            ],
        },
    }
    if request.step in script:
        return script[request.step]
    if request.turns[-1].reply is None and not any(turn.reply for turn in request.turns):
        return {"kind": "clarification", "question": "which account?"}
    return {"kind": "final", "answer": f"done after {request.step - 1} steps"}


AGENT = Agent(
    "snapshots",
    ScriptedModel(decide, usage=Usage(input_tokens=7, output_tokens=3, cost=0.01)),
    [lookup, fail, refund],
)


async def _write(url: str) -> None:
    from loop_actors import Runtime

    async with Runtime(url) as runtime:
        await runtime.run(AGENT, "fixture", invocation_id="snap-paused")
        await runtime.run(AGENT, "fixture", invocation_id="snap-done")
        await runtime.clarify("snap-done", answer="the first", by="ops")
        await runtime.resume("snap-done", AGENT)


def restore(dump: Path, path: Path) -> Path:
    """A SQLite store at ``path`` made from a fixture's SQL dump, in WAL mode as every store is."""
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.executescript(f"{dump.read_text()}\nPRAGMA journal_mode=WAL;")
    return path


def main(path: Path) -> None:
    """Write the fixture's store at ``path`` (a new SQLite file) and dump it next to it."""
    url = f"sqlite:///{path}"
    trio.run(_write, url)
    store = EventStore(url)
    for invocation_id in ("snap-paused", "snap-done"):
        events = store.events(invocation_id)
        for version in range(SNAPSHOT_EVERY, len(events) + 1, SNAPSHOT_EVERY):
            store.app.take_snapshot(invocation_id, version=version, projector_func=fold)
    store.close()
    connection = sqlite3.connect(path)
    dump = "\n".join(connection.iterdump())
    connection.close()
    path.with_suffix(".sql").write_text(dump + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
