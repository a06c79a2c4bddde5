"""Stores written by loop-actors 0.2.0: model-input digests, sleeps, sub-agents, handoffs, forks.

``tests/fixtures/store-0.2.0.sql`` (a SQLite file's ``.dump``) and
``tests/fixtures/store-0.2.0.pg.sql`` (``pg_dump --no-owner --no-privileges``, plain
SQL) were written by this module's ``main`` with the code of version 0.2.0, with::

    LOOP_ACTORS_TEST_PG=$(bash .ci/pg.sh url) .venv/bin/python -m tests.support.fixture_stores_0_2_0

(without ``LOOP_ACTORS_TEST_PG`` only the SQLite one is written). Do not regenerate
them with a later version: ``tests/store/test_stores_written_by_0_2_0.py`` proves that
what 0.2.0 wrote still loads, resumes, audits and replays, and a store written by later
code proves nothing of the kind. A later format gets fixtures of its own, written by a
module of its own (as this one is beside ``fixture_stores.py``, which wrote 0.1.0's).

Each store holds the invocations of ``tests.fixture_agents_0_2_0`` named in
``INVOCATIONS`` (with the children and handoff targets they started), written through
the public API, and one run killed with SIGKILL by a real ``loop-actors run`` process
(``LOOP_ACTORS_CRASH_AT``). ``fx2-completed`` was started inside an OpenTelemetry span
(its ``InvocationStarted.trace_parent``). Every event is in audit format 2 and every
decision records its model-input digests.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import tempfile
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import trio

from loop_actors import ForkWrites, Runtime, TerminalReason
from tests.fixture_agents_0_2_0 import DESK_ENV, agent
from tests.support.fixture_stores import FIXTURES, REPO, cli, postgres_tool

SQLITE_DUMP = FIXTURES / "store-0.2.0.sql"
POSTGRES_DUMP = FIXTURES / "store-0.2.0.pg.sql"
WRITTEN_BY = "0.2.0"
"""The version whose code wrote the fixtures."""

POSTGRES_DATABASE = "fixture_store_0_2_0"
"""The scratch database the PostgreSQL fixture is written in (dropped afterwards)."""

AGENT_REF = "tests.fixture_agents_0_2_0:agent"

INVOCATIONS: dict[str, tuple[str, TerminalReason | None]] = {
    "fx2-completed": ("refund order A-1", TerminalReason.COMPLETED),
    "fx2-approval": ("refund order A-2 in full", TerminalReason.APPROVAL_REQUIRED),
    "fx2-sleeping": ("remind ann on new year's day", TerminalReason.SLEEPING),
    "fx2-woken": ("buy bread when the shop opens", TerminalReason.COMPLETED),
    "fx2-parent": ("have order A-1 audited", TerminalReason.COMPLETED),
    "fx2-handoff": ("I want my money back", TerminalReason.HANDED_OFF),
    "fx2-fork": ("refund order A-1", TerminalReason.COMPLETED),
    "fx2-fork-paused": ("refund order A-1", TerminalReason.APPROVAL_REQUIRED),
    "fx2-killed": ("refund order A-3", None),
}
"""Each fixed id of the desk (``fixture-desk-2``), its goal, and how it stopped.

- ``fx2-completed``: a lookup (read), a refund of 40 on A-1 (a write, committed), an
  answer; started inside an OpenTelemetry span (``trace_parent``).
- ``fx2-approval``: paused ``approval_required`` on a refund of 250 on A-2; nothing ran.
- ``fx2-sleeping``: its ``remind`` call slept (``ctx.sleep_until``) until 2099: paused
  ``sleeping`` with the batch dispatched (``Paused.sleeping_calls``).
- ``fx2-woken``: a ``wait`` decision (decision schema 3) until 2099, woken early by ``ops``
  (``SleepEnded``), then an answer.
- ``fx2-parent``: its ``audit_order`` call ran the auditor as a child invocation
  (``BudgetReserved``, ``BudgetReturned``; the child's id is ``CHILD``), then an answer.
- ``fx2-handoff``: a lookup, then handed off to billing (``HANDOFF_TARGET``, which completed).
- ``fx2-fork``: a fork of ``fx2-completed`` at step 1 by ``ops`` with ``writes=dedupe``: its
  refund repeats the source's and reused its key and receipt; completed.
- ``fx2-fork-paused``: the same fork with the default ``writes=approve``: paused
  ``approval_required`` on the repeated refund.
- ``fx2-killed``: its refund of 60 on A-3 dispatched, then the process was killed
  (SIGKILL at ``after_dispatch_commit``): no result, no end; the refund never reached
  the desk. It has no row in the work queue: ``resume`` continues it.
"""

FORK_REASON = "again from the lookup"


async def _write_in_process(url: str) -> None:
    async with Runtime(url) as runtime:
        for invocation_id in ("fx2-approval", "fx2-sleeping", "fx2-parent"):
            await _run(runtime, invocation_id)
        await _run(runtime, "fx2-woken", ended=TerminalReason.SLEEPING)  # woken below
        await _run(runtime, "fx2-handoff", ended=TerminalReason.COMPLETED)  # billing's end
        await _run_in_a_span(runtime, "fx2-completed")
    # A second runtime, as the 0.1.0 fixtures' cancel: the pauses' queue rows are written.
    async with Runtime(url) as runtime:
        assert await runtime.wake("fx2-woken", by="ops")
        woken = await runtime.resume("fx2-woken", agent)
        assert woken.reason is TerminalReason.COMPLETED, woken
        # The same fork twice: its repeat of the source's refund reuses the source's key
        # and receipt (dedupe), or waits for a person (the default, approve).
        for fork_id, writes in (
            ("fx2-fork", ForkWrites.DEDUPE),
            ("fx2-fork-paused", ForkWrites.APPROVE),
        ):
            forked = await runtime.fork(
                "fx2-completed",
                at_step=1,
                by="ops",
                reason=FORK_REASON,
                agent=agent,
                fork_id=fork_id,
                writes=writes,
            )
            assert forked.outcome is not None
            assert forked.outcome.reason is INVOCATIONS[fork_id][1], forked


async def _run(
    runtime: Runtime, invocation_id: str, *, ended: TerminalReason | None = None
) -> None:
    goal, reason = INVOCATIONS[invocation_id]
    outcome = await runtime.run(agent, goal, invocation_id=invocation_id)
    assert outcome.reason is (ended or reason), outcome


async def _run_in_a_span(runtime: Runtime, invocation_id: str) -> None:
    """Run it in an OpenTelemetry span of the application's: its start records the span."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())  # once a process; no exporter: spans go nowhere
    with trace.get_tracer("fixture").start_as_current_span("write the fixture"):
        await _run(runtime, invocation_id)


def _kill_after_dispatch(url: str, desk: Path) -> None:
    """Run ``fx2-killed`` in a real process that SIGKILLs itself after its dispatch commit."""
    goal, _ = INVOCATIONS["fx2-killed"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOP_ACTORS_")}
    env.update({"LOOP_ACTORS_CRASH_AT": "after_dispatch_commit", DESK_ENV: str(desk)})
    killed = subprocess.run(
        [cli(), "run", AGENT_REF, "--goal", goal, "--id", "fx2-killed", "--db", url],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)


def write_store(url: str, scratch: Path) -> None:
    """Write every invocation of ``INVOCATIONS`` into the (new) store at ``url``."""
    desk = scratch / "desk.db"
    os.environ[DESK_ENV] = str(desk)
    trio.run(_write_in_process, url)
    _kill_after_dispatch(url, desk)


def write_sqlite(target: Path) -> None:
    """Write the store in a new SQLite file and dump it (``.dump`` text) to ``target``."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "store.db"
        write_store(f"sqlite:///{path}", Path(folder))
        with closing(sqlite3.connect(path)) as connection:
            dump = "\n".join(connection.iterdump())
    target.write_text(dump + "\n")


def write_postgres(admin: str, target: Path) -> None:
    """Write the store in a new PostgreSQL database and ``pg_dump`` it to ``target``."""
    import psycopg

    def recreate(create: bool) -> None:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{POSTGRES_DATABASE}" WITH (FORCE)')
            if create:
                connection.execute(f'CREATE DATABASE "{POSTGRES_DATABASE}"')

    recreate(create=True)
    url = urlunsplit(urlsplit(admin)._replace(path=f"/{POSTGRES_DATABASE}"))
    try:
        with tempfile.TemporaryDirectory() as folder:
            write_store(url, Path(folder))
        dump = [postgres_tool("pg_dump"), "--no-owner", "--no-privileges", "-f", str(target), url]
        subprocess.run(dump, check=True, timeout=120)
    finally:
        recreate(create=False)


def main(argv: list[str] | None = None) -> None:
    """Write ``store-0.2.0.sql`` and, given a PostgreSQL admin URL, ``store-0.2.0.pg.sql``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pg",
        default=os.environ.get("LOOP_ACTORS_TEST_PG"),
        help="a PostgreSQL admin URL (default $LOOP_ACTORS_TEST_PG); without one, SQLite only",
    )
    args = parser.parse_args(argv)
    write_sqlite(SQLITE_DUMP)
    print(f"wrote {SQLITE_DUMP}")
    if args.pg:
        write_postgres(args.pg, POSTGRES_DUMP)
        print(f"wrote {POSTGRES_DUMP}")


if __name__ == "__main__":
    main()
