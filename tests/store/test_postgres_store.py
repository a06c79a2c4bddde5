"""The event store on a real PostgreSQL server: URLs, clear errors, races, group commit, outages.

The tests that stop a server start a private one of their own (``.ci/pg.sh`` with
``LOOP_ACTORS_PG_ROOT=/tmp/pg-stop-test``, port 55499), with password
authentication for one user; the others use a fresh database of the shared server
(the ``postgres_url`` fixture).

Bad inputs tried: URLs without a host, user or database name, with a bad port,
a fragment, unknown or malformed options, a second path segment; a server that
does not listen, a host that does not resolve, a database that does not exist, a
user that does not exist, a wrong password (every message checked for the
password); the events table locked by another session (past ``lock_timeout``,
with and without ``lock_retry``); the server stopped in the middle of a run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from loop_actors import (
    Agent,
    ModelRequest,
    Runtime,
    ScriptedModel,
    StoreUnavailableError,
    StoreUrlError,
    TerminalReason,
    tool,
)
from loop_actors.store.store import EventStore
from loop_actors.store.url import StoreUrl
from projections import list_invocations
from tests.conftest import postgres_admin_url
from tests.support.cli import run_cli
from tests.support.events import started

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- URLs (no I/O)


def test_a_postgresql_url_names_host_port_database_user_and_password() -> None:
    url = StoreUrl.parse("postgresql://app:s%40cret@db.example:6543/loop_actors")
    assert (url.kind, url.host, url.port, url.dbname, url.user) == (
        "postgresql",
        "db.example",
        6543,
        "loop_actors",
        "app",
    )
    assert url.password == "s@cret"
    assert url.server == "db.example:6543/loop_actors"
    assert url.display == "postgresql://app:***@db.example:6543/loop_actors"
    assert "cret" not in repr(url)


def test_postgres_is_the_same_scheme_and_the_port_defaults_to_5432() -> None:
    url = StoreUrl.parse("postgres://app@localhost/db")
    assert (url.kind, url.port, url.password) == ("postgresql", 5432, None)


def test_postgresql_options_are_read_and_checked() -> None:
    url = StoreUrl.parse(
        "postgresql://a:p@h/db?lock_timeout=3&lock_retry=0.5&connect_timeout=2&pool_size=4&mode=ro"
    )
    assert (url.lock_timeout_s, url.lock_retry_s, url.connect_timeout_s, url.pool_size) == (
        3,
        0.5,
        2,
        4,
    )
    assert url.read_only
    environment = url.environment()
    assert environment["POSTGRES_ENABLE_DB_FUNCTIONS"] == "n"
    assert environment["LOOPACTORS_POSTGRES_ENABLE_DB_FUNCTIONS"] == "n"  # beats the process env
    assert environment["POSTGRES_LOCK_TIMEOUT"] == "3"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql:/h/db", "a PostgreSQL URL is"),
        ("postgresql://", "a PostgreSQL URL is"),
        ("postgresql://u:p@/db", "no host"),
        ("postgresql://h/db", "no user"),
        ("postgresql://u:p@h", "no database name"),
        ("postgresql://u:p@h/", "no database name"),
        ("postgresql://u:p@h/db/extra", "no database name"),
        ("postgresql://u:p@h:port/db", "the port must be a number"),
        ("postgresql://u:p@h:0/db", "the port must be a number"),
        ("postgresql://u:p@h:70000/db", "the port must be a number"),
        ("postgresql://u:p@h/db#x", "no #fragment"),
        ("postgresql://u:p@h/db?sslmode=require", "unknown database URL option"),
        ("postgresql://u:p@h/db?lock_timeout=0", "at least 1 second"),
        ("postgresql://u:p@h/db?connect_timeout=x", "whole seconds"),
        ("postgresql://u:p@h/db?pool_size=0", "pool_size must be at least 1"),
        ("postgresql://u:p@h/db?pool_size=many", "pool_size must be a whole number"),
        ("postgresql://u:p@h/db?lock_retry=-1", "0 or more seconds"),
        ("postgresql://u:p@h/db?mode=rw", "mode=ro"),
        ("sqlite:///x.db?pool_size=2", "unknown database URL option"),
    ],
)
def test_malformed_postgresql_urls_are_refused_without_their_password(
    url: str, message: str
) -> None:
    with pytest.raises(StoreUrlError, match=message) as raised:
        StoreUrl.parse(url.replace("u:p@", "u:TopSecret@"))
    assert "TopSecret" not in str(raised.value)


# --------------------------------------------------------------------------- clear errors


def _unreachable_url() -> str:
    return "postgresql://postgres:TopSecret@127.0.0.1:1/postgres?connect_timeout=2"


def _admin_parts() -> tuple[str, str]:
    """(user:password@host:port, database) of the shared server's admin URL."""
    admin = postgres_admin_url()
    rest = admin.split("://", 1)[1]
    return rest.rsplit("/", 1)[0], rest.rsplit("/", 1)[1]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("unreachable", "cannot reach PostgreSQL at 127.0.0.1:1 (Connection refused)"),
        ("unresolvable", "cannot reach PostgreSQL at no-such-host.invalid:5432"),
        ("missing database", "has no database 'no_such_database'"),
        ("unknown user", "has no user 'no_such_user' (wrong credentials)"),
    ],
)
def test_a_store_that_cannot_be_opened_raises_one_clear_line_without_the_password(
    case: str, message: str
) -> None:
    where, _ = _admin_parts()
    host = where.split("@", 1)[1]
    url = {
        "unreachable": _unreachable_url(),
        "unresolvable": "postgresql://u:TopSecret@no-such-host.invalid/db?connect_timeout=2",
        "missing database": f"postgresql://postgres:TopSecret@{host}/no_such_database",
        "unknown user": f"postgresql://no_such_user:TopSecret@{host}/postgres",
    }[case]
    with pytest.raises(StoreUnavailableError) as raised:
        EventStore(url)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert "TopSecret" not in str(raised.value)


@pytest.mark.parametrize("command", [["history", "x"], ["audit", "verify"], ["resume", "x"]])
def test_the_cli_says_an_unreachable_server_in_one_line_and_exits_2(
    tmp_path: Path, command: list[str]
) -> None:
    if command[0] == "resume":
        command = [*command, "--agent", "tests.support.audit:AGENT"]
    done = run_cli(*command, cwd=REPO, env={"LOOP_ACTORS_DB": _unreachable_url()})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "cannot reach PostgreSQL at 127.0.0.1:1" in done.stderr
    assert "TopSecret" not in done.stderr + done.stdout


# --------------------------------------------------------------------------- the store


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look a key up."""
    return {"key": key}


def _two_steps(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "lookup", "arguments": {"key": "k"}}],
        }
    return {"kind": "final", "answer": "done"}


AGENT = Agent("pg", ScriptedModel(_two_steps), [lookup])


def _sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as connection:
        cursor = connection.execute(statement)
        return cursor.fetchall() if cursor.description else []


async def test_the_journal_commits_many_invocations_rows_in_one_transaction(
    postgres_url: str,
) -> None:
    agent = Agent("g", ScriptedModel([{"kind": "final", "answer": "x"}], delay_s=0.01))
    with trio.fail_after(60):
        async with Runtime(postgres_url) as runtime, trio.open_nursery() as nursery:
            for n in range(40):
                nursery.start_soon(runtime.run, agent, f"goal {n}")
    # xmin is the id of the transaction that wrote a row: 80 commits, fewer transactions.
    rows = _sql(postgres_url, "SELECT xmin::text::bigint, originator_id FROM loopactors_events")
    assert len(rows) == 120  # started, decided, terminated: three rows each
    transactions = {xmin for xmin, _ in rows}
    assert len(transactions) < 80
    invocations_per_transaction = max(
        len({inv for xmin, inv in rows if xmin == t}) for t in transactions
    )
    assert invocations_per_transaction > 1


def test_processes_creating_the_tables_at_once_all_open_the_same_store(
    postgres_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "open.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from loop_actors.store.store import EventStore
            start = float(sys.argv[2])
            time.sleep(max(0.0, start - time.time()))
            store = EventStore(sys.argv[1])
            print(store.store_id)
            store.close()
            """
        )
    )
    start = time.time() + 3  # after both have imported everything
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), postgres_url, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=60) for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs
    identities = {out.strip() for out, _ in outputs}
    assert len(identities) == 1
    store = EventStore(postgres_url)
    assert store.store_id in identities
    store.close()


async def test_a_run_waits_for_a_table_lock_released_within_lock_retry(postgres_url: str) -> None:
    EventStore(postgres_url).close()  # the tables exist
    url = postgres_url + "?lock_timeout=1&lock_retry=10"
    with psycopg.connect(postgres_url) as blocker, trio.fail_after(60):
        blocker.execute("LOCK TABLE loopactors_events IN EXCLUSIVE MODE")
        async with Runtime(url) as runtime, trio.open_nursery() as nursery:
            outcomes: list[Any] = []

            async def run() -> None:
                outcomes.append(await runtime.run(AGENT, "g", invocation_id="waits"))

            nursery.start_soon(run)
            await trio.sleep(1.5)  # past lock_timeout: the Journal retries
            assert outcomes == []
            blocker.rollback()
    assert outcomes[0].reason is TerminalReason.COMPLETED


async def test_a_table_lock_held_past_lock_retry_ends_the_run_checkpoint_failed(
    postgres_url: str,
) -> None:
    EventStore(postgres_url).close()
    url = postgres_url + "?lock_timeout=1&lock_retry=0"
    with psycopg.connect(postgres_url) as blocker, trio.fail_after(60):

        @tool
        async def lock_the_table(key: str) -> dict[str, str]:
            """Have another session take the events table's lock, and keep it."""
            await trio.to_thread.run_sync(
                blocker.execute, "LOCK TABLE loopactors_events IN EXCLUSIVE MODE"
            )
            return {"key": key}

        def decide(request: ModelRequest) -> dict[str, Any]:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c1", "name": "lock_the_table", "arguments": {"key": "k"}}],
            }

        agent = Agent("locker", ScriptedModel(decide), [lock_the_table])
        outcome = await Runtime(url).run(agent, "g", invocation_id="locked")
        blocker.rollback()
    assert outcome.reason is TerminalReason.CHECKPOINT_FAILED
    assert "lock timeout" in (outcome.detail or "")
    # What was committed before the lock stays; the results were not written.
    history = EventStore(postgres_url).events("locked")
    assert [type(e).__name__ for e in history] == [
        "InvocationStarted",
        "DecisionProposed",
        "BatchDispatched",
    ]


async def test_a_first_commit_that_cannot_get_the_lock_is_refused_and_writes_nothing(
    postgres_url: str,
) -> None:
    EventStore(postgres_url).close()
    url = postgres_url + "?lock_timeout=1&lock_retry=0"
    with psycopg.connect(postgres_url) as blocker, trio.fail_after(60):
        blocker.execute("LOCK TABLE loopactors_events IN EXCLUSIVE MODE")
        with pytest.raises(StoreUnavailableError, match="lock timeout"):
            await Runtime(url).run(AGENT, "g", invocation_id="locked")
        blocker.rollback()
    assert EventStore(postgres_url).invocation_ids() == []


async def test_a_store_url_with_mode_ro_reads_and_refuses_every_write(postgres_url: str) -> None:
    done = await Runtime(postgres_url).run(AGENT, "g", invocation_id="one")
    read_only = postgres_url + "?mode=ro"
    store = EventStore(read_only, create=False, read_only=True)
    assert [e.originator_version for e in store.events("one")] == [1, 2, 3, 4, 5, 6]
    store.close()
    with pytest.raises(StoreUnavailableError, match="says mode=ro"):
        await Runtime(read_only).run(AGENT, "g", invocation_id="two")
    assert done.reason is TerminalReason.COMPLETED


def test_reading_a_database_without_a_store_says_it_is_not_one(postgres_url: str) -> None:
    with pytest.raises(StoreUnavailableError, match="is not a loop-actors store"):
        EventStore(postgres_url, create=False, read_only=True)
    assert _sql(postgres_url, "SELECT to_regclass('loopactors_events')") == [(None,)]


def test_the_cli_runs_resumes_and_shows_history_on_postgresql(
    postgres_url: str, tmp_path: Path
) -> None:
    env = {"LOOP_ACTORS_DB": postgres_url, "PYTHONPATH": str(REPO)}
    ran = run_cli(
        "run", "tests.support.audit:AGENT", "--goal", "refund", "--id", "r1", cwd=REPO, env=env
    )
    assert ran.returncode == 0, ran.stderr
    password = StoreUrl.parse(postgres_url).password
    assert password
    assert f":{password}@" not in ran.stdout  # the "history:" hint shows the URL without it
    resumed = run_cli("resume", "r1", "--agent", "tests.support.audit:AGENT", cwd=REPO, env=env)
    assert resumed.returncode == 0, resumed.stderr
    history = run_cli("history", "r1", "--json", cwd=REPO, env=env)
    assert history.returncode == 0, history.stderr
    assert history.stdout.count("\n") == 9
    verified = run_cli("audit", "verify", cwd=REPO, env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "0 broken" in verified.stdout


@pytest.mark.parametrize("command", ["show", "list", "metrics", "effects"])
def test_read_model_commands_on_postgresql_keep_them_in_the_stores_database(
    postgres_url: str, command: str
) -> None:
    done = Runtime(postgres_url).run_sync(AGENT, "g", invocation_id="one")
    assert done.reason is TerminalReason.COMPLETED
    args = [command, "one"] if command == "show" else [command]
    shown = run_cli(*args, "--json", cwd=REPO, db=postgres_url)
    assert shown.returncode == 0, shown.stderr
    assert "in memory" not in shown.stderr
    if command in ("show", "list"):
        assert '"one"' in shown.stdout
    with psycopg.connect(postgres_url) as connection:
        positions = connection.execute(
            "SELECT application_name, notification_id FROM read_model_tracking "
            "WHERE application_name LIKE %s ORDER BY 1",
            ["%:LoopActors"],
        ).fetchall()
    assert [name for name, _ in positions] == [
        "metrics:LoopActors",
        "open_effects:LoopActors",
        "trajectory:LoopActors",
    ]
    assert len({position for _, position in positions}) == 1


def test_projections_on_postgresql_live_in_its_database_or_in_a_views_file(
    postgres_url: str, tmp_path: Path
) -> None:
    Runtime(postgres_url).run_sync(AGENT, "g", invocation_id="one")
    status = run_cli("projections", "status", "--json", cwd=REPO, db=postgres_url)
    assert status.returncode == 0, status.stderr
    assert all('"lag": ' in line for line in status.stdout.splitlines())
    rebuilt = run_cli("projections", "rebuild", cwd=REPO, db=postgres_url)
    assert rebuilt.returncode == 0, rebuilt.stderr
    views = str(tmp_path / "pg.views.db")
    built = run_cli("projections", "catch-up", "--views", views, cwd=REPO, db=postgres_url)
    assert built.returncode == 0, built.stderr
    listed = run_cli("list", "--views", views, "--json", cwd=REPO, db=postgres_url)
    assert listed.returncode == 0, listed.stderr
    assert '"one"' in listed.stdout
    assert "in memory" not in listed.stderr


async def test_a_runtime_on_postgresql_follows_its_read_models(postgres_url: str) -> None:
    async with Runtime(postgres_url, follow_projections=True) as runtime:
        assert runtime.projections is not None
        for i in range(3):
            await runtime.run(AGENT, "g", invocation_id=f"live-{i}")
        with trio.fail_after(20):
            while any(s.lag for s in runtime.projections.status()):  # noqa: ASYNC110 - polls a database
                await trio.sleep(0.01)
        listed = list_invocations(runtime.projections)
    assert sorted(row["invocation_id"] for row in listed) == ["live-0", "live-1", "live-2"]


def _translated(cause: BaseException) -> BaseException:
    """A psycopg error as eventsourcing hands it on: its own class, psycopg's as the cause."""
    from eventsourcing.persistence import OperationalError

    error = OperationalError(str(cause))
    error.__cause__ = cause
    return error


def test_the_journal_waits_for_a_lock_but_not_for_a_lost_connection() -> None:
    import psycopg_pool

    from loop_actors.store.journal import is_lock_failure

    for retried in (
        psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.SerializationFailure("could not serialize access"),
    ):
        assert is_lock_failure(_translated(retried)), retried
    for failed in (
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg_pool.PoolTimeout("couldn't get a connection after 5.00 sec"),
        psycopg.OperationalError("the table is locked"),  # the message heuristic is SQLite's
    ):
        assert not is_lock_failure(_translated(failed)), failed


def test_db_functions_stay_off_whatever_the_environment_says(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """POSTGRES_ENABLE_DB_FUNCTIONS (an insert without the table lock) is never used."""
    monkeypatch.setenv("POSTGRES_ENABLE_DB_FUNCTIONS", "y")
    monkeypatch.setenv("LOOPACTORS_POSTGRES_ENABLE_DB_FUNCTIONS", "y")
    store = EventStore(postgres_url)
    store.append(started("a"))
    recorder: Any = store.app.recorder
    assert recorder.datastore.enable_db_functions is False
    store.close()
    functions = _sql(postgres_url, "SELECT proname FROM pg_proc WHERE proname LIKE 'es_insert%'")
    assert functions == []


def test_lock_statements_of_another_shape_are_refused_when_the_store_opens(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards an eventsourcing upgrade: rows are never written without the table lock."""
    from eventsourcing.postgres import PostgresApplicationRecorder

    original = PostgresApplicationRecorder.__init__

    def upgraded(recorder: Any, *args: Any, **kwargs: Any) -> None:
        original(recorder, *args, **kwargs)
        recorder.lock_table_statements = recorder.lock_table_statements[:1]

    monkeypatch.setattr(PostgresApplicationRecorder, "__init__", upgraded)
    with pytest.raises(StoreUnavailableError, match="unexpected lock statements"):
        EventStore(postgres_url)


# --------------------------------------------------------------------------- a private server

PRIVATE_ROOT = "/tmp/pg-stop-test"  # noqa: S108 (the postgres user must reach it: not pytest's 0700 tmp)
PRIVATE_PORT = 55499
APP_PASSWORD = "right-Secret-1"


def _private(action: str) -> None:
    env = {
        **os.environ,
        "LOOP_ACTORS_PG_ROOT": PRIVATE_ROOT,
        "LOOP_ACTORS_PG_PORT": str(PRIVATE_PORT),
    }
    subprocess.run(
        ["bash", str(REPO / ".ci" / "pg.sh"), action], env=env, check=True, capture_output=True
    )


@pytest.fixture(scope="module")
def private_server() -> Iterator[str]:
    """A private PostgreSQL server that tests may stop; user ``la_app`` logs in with a password.

    Yields the URL of a database owned by ``la_app``.
    """
    postgres_admin_url()  # skip (or fail) as the shared server's tests do
    _private("start")
    admin = f"postgresql://postgres@127.0.0.1:{PRIVATE_PORT}/postgres"
    try:
        with psycopg.connect(admin, autocommit=True) as connection:
            hba = connection.execute("SHOW hba_file").fetchone()
            assert hba is not None
            rule = "host all la_app 127.0.0.1/32 scram-sha-256\n"
            text = Path(hba[0]).read_text()
            if rule not in text:
                Path(hba[0]).write_text(rule + text)
            connection.execute("SELECT pg_reload_conf()")
            if not connection.execute("SELECT 1 FROM pg_roles WHERE rolname = 'la_app'").fetchone():
                connection.execute(f"CREATE ROLE la_app LOGIN PASSWORD '{APP_PASSWORD}'")
            connection.execute("DROP DATABASE IF EXISTS la_private WITH (FORCE)")
            connection.execute("CREATE DATABASE la_private OWNER la_app")
        yield f"postgresql://la_app:{APP_PASSWORD}@127.0.0.1:{PRIVATE_PORT}/la_private"
    finally:
        _private("stop")


def test_a_wrong_password_is_one_clear_line_that_never_shows_either_password(
    private_server: str,
) -> None:
    wrong = private_server.replace(APP_PASSWORD, "Wrong-Guess-7")
    with pytest.raises(StoreUnavailableError) as raised:
        EventStore(wrong)
    message = str(raised.value)
    assert message == (
        f"PostgreSQL at 127.0.0.1:{PRIVATE_PORT}/la_private refused the password of user "
        "'la_app' (wrong credentials)"
    )
    done = run_cli("history", "x", cwd=REPO, db=wrong)
    assert done.returncode == 2
    assert done.stderr == f"loop-actors: error: {message}\n"
    assert "Wrong-Guess-7" not in done.stderr
    EventStore(private_server).close()  # the right one opens


def test_a_missing_password_says_where_one_can_be_given(
    private_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent")
    without = private_server.replace(f":{APP_PASSWORD}@", "@")
    with pytest.raises(StoreUnavailableError, match="asks for the password of user 'la_app'"):
        EventStore(without)
    monkeypatch.setenv("PGPASSWORD", APP_PASSWORD)  # libpq's own variable
    EventStore(without).close()


async def test_a_server_stopped_mid_run_ends_it_checkpoint_failed_and_resume_continues_later(
    private_server: str,
) -> None:
    url = private_server + "?connect_timeout=2"
    tool_started, release = trio.Event(), trio.Event()

    @tool
    async def slow(key: str) -> dict[str, str]:
        """Wait until the test has stopped the server."""
        tool_started.set()
        await release.wait()
        return {"key": key}

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c1", "name": "slow", "arguments": {"key": "k"}}],
            }
        return {"kind": "final", "answer": "done"}

    agent = Agent("outage", ScriptedModel(decide), [slow])
    with trio.fail_after(120):
        async with Runtime(url) as runtime:
            async with trio.open_nursery() as nursery:
                outcomes: list[Any] = []

                async def run() -> None:
                    outcomes.append(await runtime.run(agent, "g", invocation_id="cut"))

                nursery.start_soon(run)
                await tool_started.wait()  # BatchDispatched is committed
                await trio.to_thread.run_sync(_private, "stop")
                release.set()
            assert outcomes[0].reason is TerminalReason.CHECKPOINT_FAILED
            detail = outcomes[0].detail or ""
            assert f"PostgreSQL at 127.0.0.1:{PRIVATE_PORT}/la_private" in detail, detail
            assert APP_PASSWORD not in detail
            await trio.to_thread.run_sync(_private, "start")
            # The same runtime's pool reconnects: a new run works.
            fresh = await runtime.run(AGENT, "after", invocation_id="after")
            assert fresh.reason is TerminalReason.COMPLETED
        # Nothing committed was lost, and resume continues where the store stands.
        release.set()
        resumed = await Runtime(url).resume("cut", agent)
    assert resumed.reason is TerminalReason.COMPLETED
    history = await Runtime(url).history("cut")
    assert [type(e).__name__ for e in history] == [
        "InvocationStarted",
        "DecisionProposed",
        "BatchDispatched",
        "ResultsCommitted",
        "DecisionProposed",
        "Terminated",
    ]
