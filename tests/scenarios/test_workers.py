"""Worker processes on one store: real subprocesses, real SIGKILL and SIGTERM, a real service.

Each story copies the payment agent (``payments_app``, with a slower model in
``workers_app``) into a folder, submits invocations, and runs ``loop-actors
worker`` processes on one SQLite file. The payment service keeps its own ledger
of idempotency keys, so "every payment exactly once" is checked where it counts.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.audit import GENESIS
from aggregates.lease import HolderRow, QueueRow
from loop_actors import EventStore, Runtime, StoreUnavailableError, StoreUrlError
from loop_actors.store.history_records import event_record
from loop_actors.store.queue import PostgresQueue, SQLiteQueue, WorkQueue
from loop_actors.store.url import StoreUrl
from tests.support import payments_app
from tests.support.cli import CLI, cli_env, run_cli
from tests.support.history import assert_history_is_whole
from tests.support.payments_app import PaymentService

pytestmark = pytest.mark.slow

HERE = Path(__file__).parents[1] / "support"
AGENT_REF = "workers_app:agent"


class Folder:
    """A workspace: the agent's modules, the store, the service's ledger, the workers."""

    def __init__(self, path: Path, model_delay_s: float, db: str | None = None) -> None:
        self.path = path
        for name in ("payments_app.py", "workers_app.py"):
            shutil.copy(HERE / name, path / name)
        self.db = db or f"sqlite:///{path / 'run.db'}"
        self.env = {
            "PAYMENTS_DB": str(path / "service.db"),
            "WORKERS_MODEL_DELAY_S": str(model_delay_s),
        }
        self.workers: list[subprocess.Popen[str]] = []

    def submit(self, count: int, prefix: str = "inv") -> list[str]:
        async def submit_all() -> list[str]:
            async with Runtime(self.db) as runtime:
                return [
                    await runtime.submit(
                        payments_app.agent, "pay bob and carol", invocation_id=f"{prefix}-{n:03}"
                    )
                    for n in range(count)
                ]

        return trio.run(submit_all)

    def start_worker(
        self, *extra: str, lease_s: float = 2, grace_s: float = 10, prefix: Sequence[str] = ()
    ) -> subprocess.Popen[str]:
        """A ``loop-actors worker`` process (``prefix``: a command it runs under)."""
        process = subprocess.Popen(
            [
                *prefix,
                *CLI,
                "worker",
                "--agent",
                AGENT_REF,
                "--lease-s",
                str(lease_s),
                "--grace-s",
                str(grace_s),
                "--db",
                self.db,
                *extra,
            ],
            cwd=self.path,
            env=cli_env(**self.env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.workers.append(process)
        return process

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, cwd=self.path, db=self.db, env=self.env)

    def _queue(self) -> WorkQueue:
        if self.db.startswith("sqlite:///"):
            return SQLiteQueue(self.db.removeprefix("sqlite:///"), read_only=True)
        return PostgresQueue(self.db)

    def _read(self) -> tuple[list[QueueRow], list[HolderRow]]:
        """The queue's rows and holders, as another process sees them (none yet: empty)."""
        try:
            if self.db.startswith("sqlite:///"):
                queue: WorkQueue = SQLiteQueue(self.db.removeprefix("sqlite:///"), read_only=True)
            else:
                queue = PostgresQueue(self.db)
            try:
                return queue.rows()[0], queue.holders()[0]
            finally:
                queue.close()
        except StoreUnavailableError:
            return [], []  # the store or its tables are not created yet

    def queue(self) -> list[tuple[str, str, str | None]]:
        """Every row: id, status (as stored), holder."""
        rows, _ = self._read()
        return sorted((row.invocation_id, row.status.value, row.holder) for row in rows)

    def holder_of(self, process: subprocess.Popen[str]) -> str | None:
        _, holders = self._read()
        return next((h.holder for h in holders if h.pid == process.pid), None)

    def history(self, invocation_id: str) -> list[dict[str, Any]]:
        """The invocation's events as ``loop-actors history --json`` prints them (read here)."""
        store = EventStore(self.db, read_only=True)
        try:
            events = store.events(invocation_id)
        finally:
            store.close()
        records, previous = [], GENESIS
        for event in events:
            records.append(json.loads(json.dumps(event_record(event, previous))))
            previous = event.chain_hash
        return records

    def service(self) -> PaymentService:
        return PaymentService(self.path / "service.db")


@pytest.fixture(params=["sqlite"])
def store(request: pytest.FixtureRequest) -> str | None:
    """The store of a story: a SQLite file in its folder (None), or a PostgreSQL database."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("postgres_url")
    try:
        StoreUrl.parse(url)
    except StoreUrlError:
        pytest.skip("this tree has no event store on PostgreSQL yet (only its work queue)")
    return url


@pytest.fixture
def folder(tmp_path: Path, store: str | None) -> Iterator[Callable[[float], Folder]]:
    made: list[Folder] = []

    def make(model_delay_s: float = 0.05) -> Folder:
        made.append(Folder(tmp_path, model_delay_s, store))
        return made[-1]

    yield make
    for each in made:
        for process in each.workers:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=30)


BOTH_STORES = pytest.mark.parametrize("store", ["sqlite", "postgresql"], indirect=True)
"""A story told on a SQLite file and on a real PostgreSQL server."""


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def stop(
    work: Folder, process: subprocess.Popen[str], timeout_s: float = 30
) -> tuple[int, str, str]:
    """SIGTERM a worker once it has registered (its signal handlers are set by then: a
    signal sent while it still starts up would kill it with the default action)."""
    wait_until(
        lambda: process.poll() is not None or work.holder_of(process) is not None,
        30,
        "the worker to register before it is told to stop",
    )
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=timeout_s)
    return process.returncode, out, err


def assert_paid_exactly_once(folder: Folder, invocation_ids: list[str]) -> None:
    """Each invocation paid bob 30 and carol 20 once: one service row per effect key."""
    payments = folder.service().payments()
    assert len(payments) == 2 * len(invocation_ids)
    keys = [key for key, _, _ in payments]
    assert len(set(keys)) == len(keys)
    for invocation_id in invocation_ids:
        dispatched = {
            call["effect_key"]
            for record in folder.history(invocation_id)
            if record["type"] == "BatchDispatched"
            for call in record["data"]["calls"]
            if call.get("effect_key")
        }
        assert len(dispatched) == 2
        assert dispatched <= set(keys)
    # Every request the service saw used a key of a dispatched payment.
    assert {key for key, _ in folder.service().attempts()} == set(keys)


@BOTH_STORES
def test_three_workers_one_killed_midway_finish_every_invocation_and_pay_each_once(
    folder: Callable[[float], Folder],
) -> None:
    work = folder(0.05)
    ids = work.submit(30)
    workers = [work.start_worker("--concurrency", "4") for _ in range(3)]
    victim = workers[0]
    wait_until(lambda: work.holder_of(victim) is not None, 30, "the first worker to register")
    victim_id = work.holder_of(victim)
    held: list[str] = []

    def victim_holds_leases() -> bool:
        held[:] = [
            i for i, status, holder in work.queue() if holder == victim_id and status == "claimed"
        ]
        return bool(held)

    wait_until(victim_holds_leases, 30, "the first worker to hold leases")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert victim.returncode == -signal.SIGKILL
    late = work.start_worker("--concurrency", "4")  # another worker joins later
    wait_until(
        lambda: all(status == "ended" for _, status, _ in work.queue()),
        90,
        "every invocation to end",
    )
    for process in (*workers[1:], late):
        code, _, err = stop(work, process)
        assert code == 0, err

    assert [(i, s, h) for i, s, h in work.queue()] == [(i, "ended", None) for i in ids]
    for invocation_id in ids:
        records = work.history(invocation_id)
        assert_history_is_whole(records)
        assert records[-1]["data"]["reason"] == "completed"
        takeovers = [r["data"] for r in records if r["type"] == "LeaseAcquired"]
        # Only the killed worker's invocations were taken over, each from it, once.
        if invocation_id in held:
            assert [t["taken_from"] for t in takeovers] == [victim_id]
        else:
            assert all(t["taken_from"] == victim_id for t in takeovers)
    assert_paid_exactly_once(work, ids)
    audit = work.cli("audit", "verify")
    assert audit.returncode == 0, audit.stdout
    ended = work.cli("list", "--status", "ended", "--json", "--limit", "1000")
    assert ended.returncode == 0, ended.stderr
    assert len(ended.stdout.splitlines()) == len(ids)


@BOTH_STORES
def test_sigterm_during_load_exits_within_grace_leaves_nothing_claimed_and_another_finishes(
    folder: Callable[[float], Folder],
) -> None:
    work = folder(0.4)  # slow decisions: the worker is mid-step when told to stop
    ids = work.submit(8)
    first = work.start_worker("--concurrency", "4", grace_s=5)
    wait_until(lambda: sum(1 for _, s, _ in work.queue() if s == "claimed") == 4, 30, "four claims")
    asked = time.monotonic()
    code, out, err = stop(work, first)
    took = time.monotonic() - asked
    assert code == 0, err
    assert took < 5 + 2  # the grace period, and the process's own exit
    assert "stopped: claimed=" in out
    assert all(status != "claimed" for _, status, _ in work.queue())
    second = work.start_worker("--concurrency", "4")
    wait_until(
        lambda: all(status == "ended" for _, status, _ in work.queue()), 60, "the rest to end"
    )
    assert stop(work, second)[0] == 0
    for invocation_id in ids:
        records = work.history(invocation_id)
        assert_history_is_whole(records)
        # A drained lease was given back: the second worker fenced nobody off.
        assert not [r for r in records if r["type"] == "LeaseAcquired"]
    assert_paid_exactly_once(work, ids)


def test_two_workers_racing_for_one_invocation_drive_each_step_once(
    folder: Callable[[float], Folder],
) -> None:
    work = folder(0.05)
    (only,) = work.submit(1)
    racers = [work.start_worker("--concurrency", "1") for _ in range(2)]
    wait_until(lambda: work.queue()[0][1] == "ended", 60, "the invocation to end")
    reports = [stop(work, r) for r in racers]
    assert all(code == 0 for code, _, _ in reports)
    claimed = [out for _, out, _ in reports if "claimed=1" in out]
    assert len(claimed) == 1  # one worker claimed it; the other never did
    records = work.history(only)
    assert_history_is_whole(records)
    assert not [r for r in records if r["type"] == "LeaseAcquired"]
    assert_paid_exactly_once(work, [only])


def test_resume_is_refused_while_a_worker_holds_the_lease_and_take_over_fences_it(
    folder: Callable[[float], Folder],
) -> None:
    work = folder(10.0)  # the worker waits for its model longer than the CLI calls take, loaded
    (only,) = work.submit(1)
    worker = work.start_worker("--concurrency", "1", "--json", lease_s=30)
    wait_until(lambda: work.queue()[0][1] == "claimed", 30, "the claim")
    holder = work.holder_of(worker)
    refused = work.cli("resume", only, "--agent", "payments_app:agent", "--json")
    assert refused.returncode == 6, refused.stderr
    assert f"is being driven by {holder}" in refused.stderr
    assert "--take-over" in refused.stderr
    assert refused.stdout == ""
    taken = work.cli("resume", only, "--agent", "payments_app:agent", "--json", "--take-over")
    assert taken.returncode == 0, taken.stderr
    assert json.loads(taken.stdout)["reason"] == "completed"
    code, out, err = stop(work, worker)
    assert code == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["outcomes"] == {"lease_lost": 1}  # its late append was refused
    records = work.history(only)
    assert_history_is_whole(records)
    (takeover,) = [r["data"] for r in records if r["type"] == "LeaseAcquired"]
    assert takeover["taken_from"] == holder
    assert_paid_exactly_once(work, [only])
    listing = work.cli("workers", "--json")
    assert listing.returncode == 0
    assert listing.stdout == ""  # the worker deregistered when it stopped


def test_the_workers_command_shows_a_live_worker_and_its_leases(
    folder: Callable[[float], Folder],
) -> None:
    work = folder(10.0)  # the runs stay claimed while the two CLI calls look
    work.submit(2)
    worker = work.start_worker("--concurrency", "2", lease_s=30)
    wait_until(lambda: all(s == "claimed" for _, s, _ in work.queue()), 30, "both claims")
    listing = work.cli("workers", "--json")
    assert listing.returncode == 0, listing.stderr
    (record,) = [json.loads(line) for line in listing.stdout.splitlines()]
    assert record["holder"] == work.holder_of(worker)
    assert (record["kind"], record["pid"], record["alive"]) == ("worker", worker.pid, True)
    assert record["agents"] == ["payments"]
    assert sorted(lease["invocation_id"] for lease in record["leases"]) == ["inv-000", "inv-001"]
    assert all(0 < lease["expires_in_s"] <= 30 for lease in record["leases"])
    claimed = work.cli("list", "--status", "claimed", "--json")
    assert [json.loads(line)["queue_status"] for line in claimed.stdout.splitlines()] == [
        "claimed",
        "claimed",
    ]
    assert work.cli("list", "--status", "runnable").returncode == 0
    assert stop(work, worker, timeout_s=30)[0] == 0


@BOTH_STORES
@pytest.mark.parametrize(
    "crash_at", ["after_start_commit", "after_dispatch_commit:1", "after_results_commit:1"]
)
def test_a_run_killed_in_its_first_moments_on_a_new_store_is_finished_by_a_worker(
    folder: Callable[[float], Folder], crash_at: str
) -> None:
    """``loop-actors run`` SIGKILLed before its queue row could be written apart (issue 33 G).

    The store is new (no queue table yet when the run starts): the row must come with
    the start, and the run's registration with it, so that a worker sees the run gone.
    """
    work = folder(0.0)  # the run asks its model at once: no pause before its first commits
    killed = run_cli(
        "run", "payments_app:agent", "--goal", "pay bob and carol", "--id", "run-1",
        cwd=work.path, db=work.db, env={**work.env, "LOOP_ACTORS_CRASH_AT": crash_at},
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    ((invocation_id, status, run_holder),) = work.queue()
    assert (invocation_id, status) == ("run-1", "claimed")
    assert run_holder is not None
    assert run_holder.startswith("run:")
    worker = work.start_worker("--concurrency", "2")
    wait_until(lambda: work.queue()[0][1] == "ended", 30, "a worker to finish the killed run")
    code, _, err = stop(work, worker)
    assert code == 0, err

    records = work.history("run-1")
    assert_history_is_whole(records)
    assert records[-1]["data"]["reason"] == "completed"
    (takeover,) = [r["data"] for r in records if r["type"] == "LeaseAcquired"]
    assert takeover["taken_from"] == run_holder
    assert_paid_exactly_once(work, ["run-1"])
    listed = work.cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [
        (r["invocation_id"], r["reason"]) for r in map(json.loads, listed.stdout.splitlines())
    ] == [("run-1", "completed")]


CHAOS_LEASE_S = 5.0
CHAOS_POLL_S = 0.1
"""The workers' default poll (``Worker.poll_s``)."""
TAKEOVER_BOUND_S = CHAOS_LEASE_S + CHAOS_POLL_S + 5.0
"""A dead worker's leases run out a lease after its last heartbeat at the latest (on its
own machine the others' heartbeats find its process gone sooner), its runs are claimed
at the next poll, before the backlog, as soon as a slot is free (an invocation here
takes about 1.5 s). 5 s of slack for a loaded machine: the wait behind the backlog that
this replaced took 50 s at the median (issue 33, item 3)."""
CHAOS_KILLS = 5
OWN_MACHINE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child"]
OWN_MACHINE += ["--mount-proc"]
"""A worker in a PID namespace of its own: the others cannot see its process, as if it
ran on another machine, so its leases must run out before its runs are taken over."""


def _own_machines_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    tried = subprocess.run([*OWN_MACHINE, "true"], capture_output=True, check=False)
    return tried.returncode == 0


def _signal(process: subprocess.Popen[str], signum: int) -> None:
    """Signal a worker: the process, or the one ``unshare`` forked (unshare ignores SIGTERM)."""
    if isinstance(process.args, list) and process.args[0] == "unshare":
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        for pid in children.read_text().split() if children.exists() else []:
            os.kill(int(pid), signum)
    elif process.poll() is None:
        process.send_signal(signum)


def _holders(work: Folder) -> set[str]:
    return {holder.holder for holder in work._read()[1]}


def _registered(work: Folder, process: subprocess.Popen[str], before: set[str]) -> str:
    """The holder id of a worker started after ``before`` was read: the one that appears.

    (A worker in a PID namespace of its own registers pid 1: its pid names nothing here.)
    """
    found: list[str] = []

    def appeared() -> bool:
        found[:] = sorted(_holders(work) - before)
        return bool(found) or process.poll() is not None

    wait_until(appeared, 60, "a new worker to register")
    assert found, process.communicate()
    return found[0]


def _claimed_by(work: Folder, holder: str) -> list[str]:
    return [i for i, status, h in work.queue() if h == holder and status == "claimed"]


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
@pytest.mark.parametrize("machines", ["one machine", "a machine each"])
def test_workers_sigkilled_again_and_again_have_their_runs_taken_over_within_a_lease(
    folder: Callable[[float], Folder], machines: str
) -> None:
    """Three workers, lease 5 s, a random one SIGKILLed while it holds runs, five times
    (each replaced), a backlog waiting and every payment slow enough that kills land
    mid-payment: each run a dead worker held is taken over within a lease and a poll; a
    payment the service made but the dead worker never recorded is reconciled by the
    worker that takes the run over; every invocation completes (none left paused
    ``reconciliation_required``), each paid once. With a machine each, nobody sees the
    dead process: its leases must run out."""
    if machines == "a machine each" and not _own_machines_work():
        pytest.skip("unshare cannot make a PID namespace here")
    prefix = OWN_MACHINE if machines == "a machine each" else []
    work = folder(0.1)
    (work.path / "service.db.slow").write_text("0.4")
    ids = work.submit(240)
    rng = random.Random(33)  # noqa: S311 - which worker dies, nothing secret

    def start() -> tuple[subprocess.Popen[str], str]:
        before = _holders(work)
        process = work.start_worker("--concurrency", "4", lease_s=CHAOS_LEASE_S, prefix=prefix)
        return process, _registered(work, process, before)

    workers = [start() for _ in range(3)]
    kills: list[tuple[str, float, list[str]]] = []  # holder, wall-clock time, runs it held
    for kill in range(CHAOS_KILLS):
        if sum(status == "runnable" for _, status, _ in work.queue()) < 24:
            ids += work.submit(48, prefix=f"more{kill}")  # a backlog waits at every kill
        victim, victim_id = rng.choice(workers)
        wait_until(lambda: len(_claimed_by(work, victim_id)) >= 2, 60, "a worker to hold runs")  # noqa: B023
        held = _claimed_by(work, victim_id)
        killed_at = time.time()
        _signal(victim, signal.SIGKILL)
        victim.wait(timeout=10)
        kills.append((victim_id, killed_at, held))
        workers.remove((victim, victim_id))
        workers.append(start())
        wait_until(
            lambda: not _claimed_by(work, victim_id),  # noqa: B023
            TAKEOVER_BOUND_S + 10,
            "the dead worker's runs to move",
        )
        time.sleep(1)  # their LeaseAcquired is recorded before the next kill
    wait_until(
        lambda: all(status == "ended" for _, status, _ in work.queue()),
        300,
        "every invocation to end",
    )
    for process, _ in workers:
        _signal(process, signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        if not prefix:  # unshare itself says "sigprocmask unblock failed" and exits 1
            assert process.returncode == 0, err

    takeovers: list[float] = []
    reconciled = 0
    for holder, killed_at, held in kills:
        for invocation_id in held:
            events = _chaos_events(work, invocation_id)
            if any(
                type(e).__name__ == "Terminated" and e.timestamp.timestamp() < killed_at
                for e in events
            ):
                continue  # it ended just before its worker was killed
            taken = [
                e
                for e in events
                if type(e).__name__ == "LeaseAcquired" and e.timestamp.timestamp() > killed_at
            ]
            assert taken, f"{invocation_id}, held by {holder}, was never taken over"
            assert taken[0].taken_from == holder
            takeovers.append(taken[0].timestamp.timestamp() - killed_at)
            reconciled += any(
                type(e).__name__ == "ResultsCommitted"
                and any(r.effect_status == "reconciled" for r in e.results)
                for e in events
                if e.timestamp >= taken[0].timestamp
            )
    assert takeovers
    assert max(takeovers) <= TAKEOVER_BOUND_S, sorted(takeovers)
    assert reconciled >= 1, "no kill landed in a payment: nothing was reconciled"
    for invocation_id in ids:
        records = work.history(invocation_id)
        assert_history_is_whole(records)
        assert records[-1]["data"]["reason"] == "completed", records[-1]
    assert_paid_exactly_once(work, ids)
    print(  # shown with -s
        f"{machines}: {len(takeovers)} runs taken over after {len(kills)} SIGKILLs: median "
        f"{statistics.median(takeovers):.2f} s, max {max(takeovers):.2f} s "
        f"(lease {CHAOS_LEASE_S:g} s); {reconciled} reconciled by the worker that took them"
    )


def _chaos_events(work: Folder, invocation_id: str) -> list[Any]:
    store = EventStore(work.db, read_only=True)
    try:
        return list(store.events(invocation_id))
    finally:
        store.close()
