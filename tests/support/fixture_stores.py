"""Stores written by loop-actors 0.1.0, before its modules moved into subpackages.

``tests/fixtures/store-0.1.0.sql`` (a SQLite file's ``.dump``) and
``tests/fixtures/store-0.1.0.pg.sql`` (``pg_dump --no-owner --no-privileges``, plain
SQL) were written by this module's ``main`` at commit ``779b21a``, the last before the
package reorganisation (the module was ``tests/fixture_stores.py`` then), with::

    LOOP_ACTORS_TEST_PG=postgresql://postgres:postgres@127.0.0.1:55433/postgres \\
        .venv/bin/python -m tests.support.fixture_stores

(without ``LOOP_ACTORS_TEST_PG`` only the SQLite one is written). Do not regenerate
them with a later version: ``tests/store/test_stores_written_before.py`` proves that what
the earlier code wrote still loads, resumes and audits, and a store written by the
current code proves nothing of the kind.

Each store holds the invocations of ``tests.fixture_agents:agent`` (``fixture-desk``)
named in ``INVOCATIONS``, written through the public API, and one run killed with
SIGKILL by a real ``loop-actors run`` process (``LOOP_ACTORS_CRASH_AT``). Only
``loop_actors``' public names are used: the private modules' paths are what moved.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import trio

from loop_actors import Runtime, TerminalReason
from tests.fixture_agents import DESK_ENV, agent

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SQLITE_DUMP = FIXTURES / "store-0.1.0.sql"
POSTGRES_DUMP = FIXTURES / "store-0.1.0.pg.sql"
REPO = Path(__file__).resolve().parents[2]
WRITTEN_AT = "779b21a"
"""The commit whose code wrote the fixtures."""

POSTGRES_DATABASE = "fixture_store_0_1_0"
"""The scratch database the PostgreSQL fixture is written in (dropped afterwards)."""

INVOCATIONS: dict[str, tuple[str, TerminalReason | None]] = {
    "fx-completed": ("refund order A-1", TerminalReason.COMPLETED),
    "fx-approval": ("refund order A-2 in full", TerminalReason.APPROVAL_REQUIRED),
    "fx-clarify": ("where is my order?", TerminalReason.CLARIFICATION_REQUIRED),
    "fx-killed": ("refund order A-3", None),
    "fx-cancelled": ("where is my order?", TerminalReason.CANCELLED),
    "fx-cannot": ("look up order B-7", TerminalReason.CANNOT_CONTINUE),
    "fx-long": ("check the archived orders", TerminalReason.COMPLETED),
}
"""Each fixed id, its goal, and how it stopped when the fixture was written.

- ``fx-completed``: a lookup (read), a refund of 40 on A-1 (a write, committed), an answer.
- ``fx-approval``: paused ``approval_required`` on a refund of 250 on A-2; nothing ran.
- ``fx-clarify``: paused ``clarification_required`` ("which order?").
- ``fx-killed``: its refund of 60 on A-3 dispatched (``BatchDispatched``, ``EffectPrepared`` and
  ``EffectDispatched`` durable), then the process was killed (SIGKILL at ``after_dispatch_commit``): no
  result, no end; the refund never reached the desk. It must be resumed. It has no
  row in the work queue (a run's row is written soon after it starts, and the process
  died first), so no worker would claim it: ``resume`` continues it.
- ``fx-cancelled``: paused for a clarification, then cancelled by ``ops`` ("customer left").
- ``fx-cannot``: a lookup that failed (``tool_failed``), then ``cannot_continue``.
- ``fx-long``: 34 lookups and an answer, 105 events: a snapshot at version 100.
"""

AGENT_REF = "tests.fixture_agents:agent"


async def _write_in_process(url: str) -> None:
    async with Runtime(url) as runtime:
        for invocation_id in ("fx-completed", "fx-approval", "fx-clarify", "fx-cancelled"):
            goal, reason = INVOCATIONS[invocation_id]
            outcome = await runtime.run(agent, goal, invocation_id=invocation_id)
            if invocation_id == "fx-cancelled":
                reason = TerminalReason.CLARIFICATION_REQUIRED  # cancelled below
            assert outcome.reason is reason, outcome
    # A second runtime: the first one's queue rows of the paused runs are written by now (a
    # cancel right after the pause, in the same runtime, may find its row overwritten
    # ``paused`` by the pause's own release: seen at 779b21a, 2 runs in 3 on SQLite).
    async with Runtime(url) as runtime:
        cancelled = await runtime.request_cancel("fx-cancelled", by="ops", reason="customer left")
        assert cancelled == "ended", cancelled
        for invocation_id in ("fx-cannot", "fx-long"):
            goal, reason = INVOCATIONS[invocation_id]
            outcome = await runtime.run(agent, goal, invocation_id=invocation_id)
            assert outcome.reason is reason, outcome


def cli() -> str:
    """The ``loop-actors`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("loop-actors")
    if script.exists():
        return str(script)
    found = shutil.which("loop-actors")
    if found is None:
        raise RuntimeError("no loop-actors script next to this python or on PATH")
    return found


def _kill_after_dispatch(url: str, desk: Path) -> None:
    """Run ``fx-killed`` in a real process that SIGKILLs itself after its dispatch commit."""
    goal, _ = INVOCATIONS["fx-killed"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOP_ACTORS_")}
    env.update({"LOOP_ACTORS_CRASH_AT": "after_dispatch_commit", DESK_ENV: str(desk)})
    killed = subprocess.run(
        [cli(), "run", AGENT_REF, "--goal", goal, "--id", "fx-killed", "--db", url],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
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


def postgres_tool(name: str) -> str:
    """A PostgreSQL client program (``pg_dump``, ``psql``): on PATH, else Debian's newest."""
    found = shutil.which(name)
    if found is not None:
        return found
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (folder / name).exists():
            return str(folder / name)
    raise RuntimeError(f"no {name}: install PostgreSQL's client programs")


def write_postgres(admin: str, target: Path) -> None:
    """Write the store in a new PostgreSQL database and ``pg_dump`` it to ``target``."""
    import psycopg

    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{POSTGRES_DATABASE}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{POSTGRES_DATABASE}"')
    url = urlunsplit(urlsplit(admin)._replace(path=f"/{POSTGRES_DATABASE}"))
    try:
        with tempfile.TemporaryDirectory() as folder:
            write_store(url, Path(folder))
        subprocess.run(
            [postgres_tool("pg_dump"), "--no-owner", "--no-privileges", "-f", str(target), url],
            check=True,
            timeout=120,
        )
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{POSTGRES_DATABASE}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> None:
    """Write ``store-0.1.0.sql`` and, given a PostgreSQL admin URL, ``store-0.1.0.pg.sql``."""
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


def restore_sqlite(dump: Path, path: Path) -> str:
    """A SQLite store at ``path`` made from a ``.dump``, in WAL mode as every store is."""
    with closing(sqlite3.connect(path)) as connection:
        connection.executescript(f"{dump.read_text()}\nPRAGMA journal_mode=WAL;")
    return f"sqlite:///{path}"


if __name__ == "__main__":
    main()
