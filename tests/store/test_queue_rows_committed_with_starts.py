"""A start's queue row is committed with its ``InvocationStarted``, on SQLite and PostgreSQL.

A run killed in its first moments used to leave no row (it was written apart, after
the start): no worker ever saw it, and ``list`` said ``running`` for ever (issue 33 G;
the SIGKILL stories are in tests/scenarios/test_workers.py). Here: the queue's tables
exist as soon as a store is opened, and a start whose row cannot be written records
nothing at all, for each way an invocation starts (``run``, ``submit``, ``fork``).

Bad inputs tried: a queue table that refuses every new row (a trigger), for a run, a
submit and a queued fork, on both engines (nothing of the start is recorded).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from functools import partial

import pytest
import trio

from aggregates.lease import QueueStatus
from loop_actors import Agent, EventStore, Runtime, ScriptedModel, StoreUnavailableError
from loop_actors.store.schema import HOLDERS_TABLE, QUEUE_TABLE

AGENT = Agent("starter", ScriptedModel(lambda request: {"kind": "final", "answer": "done"}))

SQLITE_REFUSAL = (
    f"CREATE TRIGGER refuse_rows BEFORE INSERT ON {QUEUE_TABLE} "
    "BEGIN SELECT RAISE(ABORT, 'the queue refuses new rows'); END",
)
POSTGRES_REFUSAL = (
    "CREATE FUNCTION refuse_rows() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN RAISE EXCEPTION 'the queue refuses new rows'; END $$",
    f"CREATE TRIGGER refuse_rows BEFORE INSERT ON {QUEUE_TABLE} "
    "FOR EACH ROW EXECUTE FUNCTION refuse_rows()",
)


def execute(url: str, *statements: str) -> list[tuple[object, ...]]:
    """Run statements on the store's database from another connection; the last one's rows."""
    rows: list[tuple[object, ...]] = []
    if url.startswith("sqlite:///"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as connection:
            for statement in statements:
                rows = connection.execute(statement).fetchall()
            connection.commit()
        return rows
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        for statement in statements:
            cursor = connection.execute(statement)
            rows = cursor.fetchall() if cursor.description else []
    return rows


def tables(url: str) -> set[str]:
    if url.startswith("sqlite:///"):
        found = execute(url, "SELECT name FROM sqlite_master WHERE type = 'table'")
    else:
        found = execute(
            url, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
    return {str(name) for (name,) in found}


def invocation_ids(url: str) -> list[str]:
    store = EventStore(url)
    try:
        return store.invocation_ids()
    finally:
        store.close()


@pytest.fixture
def refuse_rows(store_url: str) -> Callable[[], None]:
    """Make the store's queue table refuse every new row from now on."""
    refusal = SQLITE_REFUSAL if store_url.startswith("sqlite:///") else POSTGRES_REFUSAL

    def refuse() -> None:
        execute(store_url, *refusal)

    return refuse


def test_a_new_store_has_its_queue_tables_before_any_invocation_starts(store_url: str) -> None:
    EventStore(store_url).close()
    assert {QUEUE_TABLE, HOLDERS_TABLE} <= tables(store_url)


async def run(runtime: Runtime) -> object:
    return await runtime.run(AGENT, "g", invocation_id="refused")


async def submit(runtime: Runtime) -> object:
    return await runtime.submit(AGENT, "g", invocation_id="refused")


async def queued_fork(runtime: Runtime) -> object:
    return await runtime.fork(
        "source", at_step=0, by="alice", reason="again", fork_id="refused", run=False
    )


@pytest.mark.parametrize("start", [run, submit, queued_fork])
async def test_a_start_whose_queue_row_is_refused_records_nothing(
    store_url: str,
    refuse_rows: Callable[[], None],
    start: Callable[[Runtime], Awaitable[object]],
) -> None:
    with trio.fail_after(30):
        async with Runtime(store_url) as runtime:
            await runtime.run(AGENT, "g", invocation_id="source")
            refuse_rows()
            with pytest.raises(StoreUnavailableError, match="refuses new rows"):
                await start(runtime)
    assert invocation_ids(store_url) == ["source"]


async def test_each_way_of_starting_leaves_its_row_as_its_start_committed_it(
    store_url: str,
) -> None:
    """A run's row is its runtime's lease, registered; a submit's and a fork's are runnable."""
    seen: dict[str, object] = {}

    async def look(request: object) -> dict[str, str]:
        # Read while the run waits for its model: the row and the holder are there already.
        seen["row"] = execute(
            store_url,
            f"SELECT status, holder, epoch FROM {QUEUE_TABLE} WHERE invocation_id = 'run'",  # noqa: S608
        )
        seen["holders"] = execute(store_url, f"SELECT holder FROM {HOLDERS_TABLE}")  # noqa: S608
        return {"kind": "final", "answer": "done"}

    with trio.fail_after(30):
        async with Runtime(store_url) as runtime:
            await runtime.run(Agent("starter", ScriptedModel(look)), "g", invocation_id="run")
            await runtime.submit(AGENT, "g", invocation_id="submitted", agent_ref="m:starter")
            await runtime.fork(
                "run", at_step=0, by="alice", reason="again", fork_id="fork", run=False
            )
            holder = runtime.holder_id
    assert seen == {"row": [("claimed", holder, 0)], "holders": [(holder,)]}
    rows = execute(
        store_url,
        f"SELECT invocation_id, status, holder, agent_ref FROM {QUEUE_TABLE} "  # noqa: S608
        "ORDER BY invocation_id",
    )
    assert rows == [
        ("fork", QueueStatus.RUNNABLE.value, None, None),
        ("run", QueueStatus.ENDED.value, None, None),
        ("submitted", QueueStatus.RUNNABLE.value, None, "m:starter"),
    ]


async def test_a_memory_store_keeps_its_queue_in_its_own_database() -> None:
    """Its rows are committed with its starts too (on its own connection, under its lock).

    Not a fix but a guard: the queue of a memory store was a private database of its own.
    """
    with trio.fail_after(30):
        async with Runtime("memory://") as runtime:
            async with trio.open_nursery() as nursery:
                for n in range(20):
                    nursery.start_soon(partial(runtime.run, AGENT, "g", invocation_id=f"run-{n}"))
            await runtime.submit(AGENT, "g", invocation_id="submitted")
            keeper = runtime._lease_keeper()
            for n in range(20):
                await keeper.wait_released(f"run-{n}")  # given back in the background
            rows, _ = await keeper.call(keeper.queue.rows)
    assert sorted((row.invocation_id, row.status) for row in rows) == sorted(
        [(f"run-{n}", QueueStatus.ENDED) for n in range(20)] + [("submitted", QueueStatus.RUNNABLE)]
    )
