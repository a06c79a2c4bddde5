"""The database goes away mid-run: a real PostgreSQL server stopped, a real disk filled.

Each story runs ``loop-actors`` in real subprocesses. While a payment's tool runs, the
test stops the PostgreSQL server (``pg_ctl -m fast stop``, through ``.ci/pg.sh stop``)
or fills the disk the SQLite store is on (a 1 MiB tmpfs: tests/support/disk.py), so
that the payment's results cannot be committed. The run must end with the documented
``checkpoint_failed``, exit 4, and one clear line on stderr (no traceback); a resume
once the store is back must finish it, the payment made once at its service. A worker
must outlive the outage: its run ends ``checkpoint_failed``, it keeps claiming with a
backoff and says so once, claims the run again when the server is back, and SIGTERM
still stops it cleanly, during the outage too.

The server is this checkout's own, in its own folder (``LOOP_ACTORS_PG_ROOT``, derived
from the checkout's path): stopping it never stops another test run's server.

Bad inputs tried: the server stopped while a write tool runs (for ``run``, a worker,
and an open ``Runtime``); the disk filled while a write tool runs; SIGTERM to a worker
whose server is down.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from aggregates.decisions import TerminalReason
from loop_actors import Agent, ModelRequest, Outcome, Runtime, ScriptedModel, tool
from tests.conftest import postgres_admin_url
from tests.support.cli import CLI, cli_env, run_cli
from tests.support.disk import fill, free, mounted_tiny_disk
from tests.support.payments_app import PaymentService

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[2]
SUPPORT = REPO / "tests" / "support"
AGENT_REF = "outage_app:agent"
CHECKOUT_HASH = hashlib.sha256(str(REPO).encode()).hexdigest()[:8]
SERVER_ROOT = f"/tmp/loop-actors-pg-outage-{CHECKOUT_HASH}"  # noqa: S108 (postgres must reach it)
"""This checkout's stoppable server's folder: never the shared test server's, nor another's."""


class Server:
    """A PostgreSQL server of this test module's own, which the tests stop and start."""

    def __init__(self) -> None:
        self._pg("start")
        self.port = int((Path(SERVER_ROOT) / "port").read_text())

    def _pg(self, action: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "LOOP_ACTORS_PG_PORT"}
        env["LOOP_ACTORS_PG_ROOT"] = SERVER_ROOT
        if action == "start" and hasattr(self, "port"):
            env["LOOP_ACTORS_PG_PORT"] = str(self.port)  # the same port, or a clear refusal
        subprocess.run(
            ["bash", str(REPO / ".ci" / "pg.sh"), action], env=env, check=True, capture_output=True
        )

    def stop(self) -> None:
        """``pg_ctl -m fast stop``: the server ends every connection and exits."""
        self._pg("stop")

    def start(self) -> None:
        """Start it again on its port (nothing happens if it runs)."""
        self._pg("start")

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    postgres_admin_url()  # skipped (or failed) as the shared server's tests are
    made = Server()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def database(server: Server) -> Iterator[str]:
    """A fresh database on the stoppable server, with a short connect timeout."""
    server.start()
    name = f"la_outage_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.admin_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql://postgres@127.0.0.1:{server.port}/{name}?connect_timeout=2"
    server.start()  # a test that failed mid-outage left it stopped
    with psycopg.connect(server.admin_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Workspace:
    """The agent's modules, the payment service's ledger and the tool's gate, in one folder."""

    def __init__(self, path: Path, db: str) -> None:
        self.path = path
        for module in ("payments_app.py", "outage_app.py"):
            shutil.copy(SUPPORT / module, path / module)
        self.gate = path / "gate"
        self.gate.mkdir()
        self.db = db
        self.env = {"PAYMENTS_DB": str(path / "service.db"), "OUTAGE_GATE": str(self.gate)}

    def start(self, *args: str, stderr: Path) -> subprocess.Popen[str]:
        """``loop-actors ARGS --db DB`` in the background, its stderr going to a file."""
        with stderr.open("w") as errors:
            return subprocess.Popen(
                [*CLI, *args, "--db", self.db],
                cwd=self.path,
                env=cli_env(**self.env),
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
            )

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, cwd=self.path, db=self.db, env=self.env)

    def wait_paid(self, process: subprocess.Popen[str]) -> None:
        """Until the payment was made and its tool waits (the store is still there)."""
        wait_until(
            lambda: (self.gate / "paid").exists() or process.poll() is not None,
            60,
            "the payment to be made",
        )
        assert process.poll() is None, process.communicate()

    def go(self) -> None:
        """Let the payment's tool return (the store was taken away meanwhile)."""
        (self.gate / "go").touch()

    def payment_requests(self) -> int:
        return len(PaymentService(self.path / "service.db").attempts())

    def receipt(self) -> str:
        ((key, _, _),) = PaymentService(self.path / "service.db").payments()
        return f"rcpt-{key[-8:]}"


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def assert_one_clear_line(stderr: str) -> None:
    """What a lost store prints on stderr: one line saying so and what happens, no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("the store cannot be used ("), stderr
    assert "runs stop at their next commit (checkpoint_failed" in lines[0]


class StoreLoss:
    """A way to lose the store mid-run and get it back, and what its error says."""

    def __init__(
        self, url: str, take: Callable[[], object], give: Callable[[], object], cause: str
    ) -> None:
        self.url, self.take_away, self.give_back, self.cause = url, take, give, cause


@pytest.fixture(params=["postgresql-server-stopped", "disk-full"])
def loss(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreLoss]:
    if request.param == "postgresql-server-stopped":
        server: Server = request.getfixturevalue("server")
        url: str = request.getfixturevalue("database")
        yield StoreLoss(
            url, server.stop, server.start, f"PostgreSQL at 127.0.0.1:{server.port}/la_outage_"
        )
        return
    with mounted_tiny_disk(tmp_path) as disk:
        yield StoreLoss(
            f"sqlite:///{disk / 'store.db'}",
            lambda: fill(disk),
            lambda: free(disk),
            "database or disk is full",
        )


def test_a_run_that_loses_its_store_mid_write_is_checkpoint_failed_and_resume_pays_once(
    tmp_path: Path, loss: StoreLoss
) -> None:
    work = Workspace(tmp_path, loss.url)
    run = work.start(
        "run", AGENT_REF, "--goal", "pay bob 30", "--id", "cut", stderr=tmp_path / "run.err"
    )
    work.wait_paid(run)
    loss.take_away()
    work.go()
    out, _ = run.communicate(timeout=120)
    err = (tmp_path / "run.err").read_text()
    assert run.returncode == 4, (out, err)
    reason, detail, totals = out.splitlines()
    assert reason == "checkpoint_failed"
    assert loss.cause in detail
    assert detail.endswith(
        "nothing of this step was recorded: resume continues from the last commit"
    )
    assert totals.startswith("steps=1 tool_calls=1 events=")
    assert_one_clear_line(err)

    loss.give_back()
    resumed = work.cli("resume", "cut", "--agent", AGENT_REF, "--json")
    assert resumed.returncode == 0, resumed.stderr
    outcome = json.loads(resumed.stdout)
    assert (outcome["reason"], outcome["answer"]) == (
        "completed",
        f"paid bob 30 ({work.receipt()})",
    )
    assert work.payment_requests() == 1  # the resume took the service's receipt


def _worker(work: Workspace, stderr: Path) -> subprocess.Popen[str]:
    return work.start("worker", "--agent", AGENT_REF, "--lease-s", "3", stderr=stderr)


def _stored_types(db: str, invocation_id: str) -> list[str]:
    async def read() -> list[str]:
        async with Runtime(db) as runtime:
            return [type(e).__name__ for e in await runtime.history(invocation_id)]

    return trio.run(read)


def test_a_worker_outlives_its_postgresql_server_and_claims_the_run_again_when_it_is_back(
    tmp_path: Path, server: Server, database: str
) -> None:
    work = Workspace(tmp_path, database)
    assert work.cli("submit", AGENT_REF, "--goal", "pay bob 30", "--id", "job").returncode == 0
    errors = tmp_path / "worker.err"
    worker = _worker(work, errors)
    try:
        work.wait_paid(worker)
        server.stop()
        work.go()
        wait_until(lambda: "cannot be used" in errors.read_text(), 60, "the worker to say so")
        time.sleep(8)  # claims go on meanwhile, backing off: several of them
        assert errors.read_text().count("the store cannot be used") == 1, errors.read_text()
        assert worker.poll() is None  # it stays up

        server.start()
        wait_until(lambda: "the store works again" in errors.read_text(), 60, "the store back")
        wait_until(lambda: _stored_types(database, "job")[-1] == "Terminated", 60, "the run to end")
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate(timeout=30)
    err = errors.read_text()
    assert worker.returncode == 0, err
    assert "outcomes: checkpoint_failed=1 completed=1" in out, out
    assert "Traceback" not in err, err
    notes = [line for line in err.splitlines() if not line.startswith("loop-actors: ")]
    assert len(notes) == 2, err  # the outage and its end: not one line per attempt
    assert notes[0].startswith("the store cannot be used (")
    assert notes[1].startswith("the store works again (it could not be used for ")
    assert "loop-actors: SIGTERM: stopping; runs stop at their next commit" in err
    assert work.payment_requests() == 1  # the second claim settled it through reconcile


def test_sigterm_stops_a_worker_whose_postgresql_server_is_down(
    tmp_path: Path, server: Server, database: str
) -> None:
    work = Workspace(tmp_path, database)
    assert work.cli("submit", AGENT_REF, "--goal", "pay bob 30", "--id", "job").returncode == 0
    errors = tmp_path / "worker.err"
    worker = _worker(work, errors)
    try:
        work.wait_paid(worker)
        server.stop()
        work.go()
        wait_until(lambda: "cannot be used" in errors.read_text(), 60, "the worker to say so")
        sent = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate(timeout=30)
    assert worker.returncode == 0, errors.read_text()
    assert "outcomes: checkpoint_failed=1" in out, out
    assert took < 20, took  # bounded waits for what cannot be written, not a hang
    assert "Traceback" not in errors.read_text()
    # Nothing was lost: once the server is back a resume finishes the run, paid once.
    server.start()
    resumed = work.cli("resume", "job", "--agent", AGENT_REF, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["reason"] == "completed"
    assert work.payment_requests() == 1


async def test_leaving_a_runtime_while_its_postgresql_server_is_down_raises_nothing(
    server: Server, database: str
) -> None:
    """Every run returned its outcome: closing the runtime must not raise after an outage."""
    started, release = trio.Event(), trio.Event()

    @tool
    async def wait(key: str) -> str:
        """Wait until the test has stopped the server."""
        started.set()
        await release.wait()
        return key

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c1", "name": "wait", "arguments": {"key": "k"}}],
            }
        return {"kind": "final", "answer": "done"}

    agent = Agent("waiter", ScriptedModel(decide), [wait])
    outcomes: list[Outcome] = []
    with trio.fail_after(120):
        async with Runtime(database) as runtime:
            async with trio.open_nursery() as nursery:

                async def run() -> None:
                    outcomes.append(await runtime.run(agent, "g", invocation_id="cut"))

                nursery.start_soon(run)
                await started.wait()
                await trio.to_thread.run_sync(server.stop)
                release.set()
            # The lease is given back in the background: that fails, the server is down.
            await runtime._lease_keeper().wait_released("cut")
        # Left with the server still down, its lease not given back: nothing raised.
        assert [o.reason for o in outcomes] == [TerminalReason.CHECKPOINT_FAILED]
        await trio.to_thread.run_sync(server.start)
        resumed = await Runtime(database).resume("cut", agent, take_over=True)
    assert resumed.reason is TerminalReason.COMPLETED
