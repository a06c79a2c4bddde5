"""Worker processes on one store: throughput for 1, 2 and 4 workers, latency, recovery.

The workload of bench/turn_overhead.py (T=5 turns; turns 1-4 ask for K=3
parallel calls of an instant read-only ``lookup``; turn 5 answers), with a model
that answers each decision after DELAY seconds (``ScriptedModel(...,
delay_s=DELAY)``). For each number of workers W, W ``loop-actors worker``
processes (``--concurrency C`` each) are started on a fresh store and register;
then N invocations are submitted, and the script waits until every one has
ended. It prints invocations/s and turns/s (from the first submit to the last
end), the p50/p99 time from an invocation's submit (its ``InvocationStarted``)
to its first turn (its first ``DecisionProposed``) under that load (a backlog:
every invocation is submitted at once), and the ratio to one worker. Then the same
latency on an idle worker, submitting one invocation at a time.

Then, with ``--kill``, it measures recovery: a worker takes C invocations (model
delay at least 0.5 s), a second worker with room for C more starts, and the first
is SIGKILLed while it holds its leases and a backlog of ``--backlog`` new invocations
(default 4 x C) waits; the time from the kill until each of its invocations is claimed
by the other worker (or has ended), against the lease: the other worker is busy with
the backlog, so each of the dead worker's runs waits for a free slot (at most one
invocation's time) and then comes before the backlog. On
one machine the other worker's heartbeat finds the killed process gone (every third
of a lease); on another machine the lease has to run out.

With ``--kills K`` (K > 1), the recovery is the chaos of issue 33's item 3 instead:
three workers (``--concurrency C`` each) serve a backlog that is topped up as it
drains; K times, a random worker is SIGKILLed while it holds runs, and replaced by a
new one. Each run it held is timed from the kill until it is claimed by another worker
(or has ended); the median and max of every such run are printed with the lease. With
``--other-machine`` each worker runs in its own PID namespace (``unshare``), as on a
machine of its own: nobody can see that a killed worker's process is gone, and its
runs are taken over only once its leases run out (the bound: a lease and a poll).

    python bench/workers.py [--n 200] [--delay 0.2] [--workers 1,2,4] [--concurrency 16]
                            [--lease-s 5] [--kill] [--backlog N] [--db URL] [--dir /tmp]
                            [--kills K] [--other-machine] [--seed S]
    python bench/workers.py --quick        # --n 60 --workers 1,2 --kill

``--db postgresql://...`` runs on PostgreSQL (each W gets the database emptied);
the default is a SQLite file in ``--dir``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from turn_overhead import T, decide, lookup  # noqa: E402

from loop_actors import Agent, Budget, EventStore, Runtime, ScriptedModel  # noqa: E402

DELAY_ENV = "BENCH_MODEL_DELAY_S"

agent = Agent(
    "bench-workers",
    ScriptedModel(decide, delay_s=float(os.environ.get(DELAY_ENV, "0.2"))),
    [lookup],
    Budget(max_steps=T + 1, max_tool_calls=100),
)
"""The agent the worker processes serve (``workers:agent``, from this folder)."""


UNSHARE = [
    "unshare",
    "--user",
    "--map-root-user",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount-proc",
]
"""A worker of its own PID namespace: no other worker can see its process (``--other-machine``)."""


def unshared(process: subprocess.Popen[str]) -> bool:
    return isinstance(process.args, list) and process.args[0] == "unshare"


def send(process: subprocess.Popen[str], signum: int) -> None:
    """Signal a worker: the process itself, or the one ``unshare`` forked (it ignores SIGTERM)."""
    if unshared(process):
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        for pid in children.read_text().split() if children.exists() else []:
            os.kill(int(pid), signum)
    elif process.poll() is None:
        process.send_signal(signum)


def worker_process(
    db: str, concurrency: int, lease_s: float, delay: float, *, other_machine: bool = False
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(UNSHARE if other_machine else []),
            sys.executable,
            "-m",
            "loop_actors.cli.main",
            "worker",
            "--agent",
            "workers:agent",
            "--concurrency",
            str(concurrency),
            "--lease-s",
            str(lease_s),
            "--grace-s",
            "5",
            "--db",
            db,
        ],
        cwd=HERE,
        env={**os.environ, DELAY_ENV: str(delay)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


class Queue:
    """Reads the work queue's tables (SQLite file or PostgreSQL URL)."""

    def __init__(self, db: str) -> None:
        self.db = db

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self.db.startswith("postgresql"):
            import psycopg

            with psycopg.connect(self.db, autocommit=True) as connection:
                try:
                    return list(connection.execute(sql.replace("?", "%s"), params).fetchall())
                except psycopg.errors.UndefinedTable:
                    return []  # the tables are not created yet
        file = sqlite3.connect(self.db.removeprefix("sqlite:///"), timeout=30)
        try:
            return file.execute(sql, params).fetchall()
        except sqlite3.OperationalError:
            return []  # the tables are not created yet
        finally:
            file.close()

    def holders(self) -> int:
        try:
            return int(self.query("SELECT COUNT(*) FROM loop_actors_holders")[0][0])
        except Exception:
            return 0

    def not_ended(self) -> int:
        rows = self.query("SELECT COUNT(*) FROM loop_actors_queue WHERE status != 'ended'")
        return int(rows[0][0]) if rows else -1


def fresh_db(args: argparse.Namespace, name: str) -> str:
    if args.db and args.db.startswith("postgresql"):
        import psycopg

        with psycopg.connect(args.db, autocommit=True) as connection:
            for table in ("loop_actors_queue", "loop_actors_holders"):
                connection.execute(f"DROP TABLE IF EXISTS {table}")
        return str(args.db)
    return f"sqlite:///{Path(args.dir) / name}"


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


async def submit(db: str, n: int, prefix: str) -> None:
    async with Runtime(db) as runtime:
        for number in range(n):
            await runtime.submit(agent, f"{prefix}{number}", invocation_id=f"{prefix}{number:05d}")


def first_turn_latencies(db: str, ids: list[str]) -> list[float]:
    store = EventStore(db, create=False)
    try:
        latencies = []
        for invocation_id in ids:
            events = store.events(invocation_id)
            started = events[0].timestamp
            first = next(e for e in events if type(e).__name__ == "DecisionProposed")
            latencies.append((first.timestamp - started).total_seconds())
        return latencies
    finally:
        store.close()


def stop_all(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            send(process, signal.SIGTERM)
    for process in processes:
        _, err = process.communicate(timeout=60)
        # unshare says "sigprocmask unblock failed" when its child exits on a signal
        if process.returncode not in (0, -signal.SIGKILL) and not (
            unshared(process) and "Traceback" not in err
        ):
            print(err, file=sys.stderr)


def throughput(args: argparse.Namespace, workers: int) -> dict[str, float]:
    db = fresh_db(args, f"bench-workers-{workers}-{os.getpid()}.db")
    queue = Queue(db)
    trio.run(submit, db, 0, "warm")  # creates the store and its tables
    processes = [
        worker_process(db, args.concurrency, args.lease_s, args.delay) for _ in range(workers)
    ]
    try:
        wait_for(lambda: queue.holders() == workers, 60, "the workers to register")
        prefix = f"w{workers}-"
        started = time.perf_counter()
        trio.run(submit, db, args.n, prefix)
        submitted = time.perf_counter()
        wait_for(lambda: queue.not_ended() == 0, 600, "every invocation to end")
        ended = time.perf_counter()
    finally:
        stop_all(processes)
    latencies = first_turn_latencies(db, [f"{prefix}{n:05d}" for n in range(args.n)])
    seconds = ended - started
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {
        "seconds": seconds,
        "submit_s": submitted - started,
        "invocations_per_s": args.n / seconds,
        "turns_per_s": args.n * T / seconds,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": quantiles[98] * 1000,
    }


async def submit_paced(db: str, n: int, prefix: str, gap_s: float) -> None:
    async with Runtime(db) as runtime:
        for number in range(n):
            await runtime.submit(agent, f"{prefix}{number}", invocation_id=f"{prefix}{number:05d}")
            await trio.sleep(gap_s)


def idle_latency(args: argparse.Namespace) -> dict[str, float]:
    """Submit one invocation at a time to an idle worker: the latency without a backlog."""
    db = fresh_db(args, f"bench-workers-idle-{os.getpid()}.db")
    queue = Queue(db)
    trio.run(submit, db, 0, "warm")
    processes = [worker_process(db, args.concurrency, args.lease_s, args.delay)]
    count = max(5, min(args.n, 40))
    try:
        wait_for(lambda: queue.holders() == 1, 60, "the worker to register")
        trio.run(submit_paced, db, count, "i-", args.delay * T + 0.05)
        wait_for(lambda: queue.not_ended() == 0, 600, "every invocation to end")
    finally:
        stop_all(processes)
    latencies = first_turn_latencies(db, [f"i-{n:05d}" for n in range(count)])
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "count": count,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": quantiles[98] * 1000,
    }


def time_moves(
    queue: Queue, held: list[str], victim_id: str, killed: float, limit_s: float
) -> dict[str, float]:
    """How long after ``killed`` each of ``held`` was claimed by another holder (or ended)."""
    moved: dict[str, float] = {}
    marks = ",".join("?" * len(held))
    while len(moved) < len(held):
        rows = queue.query(
            f"SELECT invocation_id, status, holder FROM loop_actors_queue "  # noqa: S608
            f"WHERE invocation_id IN ({marks})",
            tuple(held),
        )
        now = time.perf_counter()
        for invocation_id, status, holder in rows:
            if invocation_id not in moved and (
                status == "ended" or holder not in (victim_id, None)
            ):
                moved[invocation_id] = now - killed
        if now - killed > limit_s:
            raise SystemExit("the killed worker's invocations did not move")
        time.sleep(0.01)
    return moved


def recovery(args: argparse.Namespace) -> dict[str, Any]:
    db = fresh_db(args, f"bench-workers-kill-{os.getpid()}.db")
    queue = Queue(db)
    delay = max(args.delay, 0.5)
    n = 2 * args.concurrency
    trio.run(submit, db, n, "k-")
    # The victim takes its fill first; the other worker has room for all of the victim's.
    victim = worker_process(db, args.concurrency, args.lease_s, delay)
    other: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: queue.holders() == 1, 60, "the victim to register")
        victim_id = str(
            queue.query("SELECT holder FROM loop_actors_holders WHERE pid = ?", (victim.pid,))[0][0]
        )
        held: list[str] = []

        def victim_holds() -> bool:
            held[:] = [
                str(row[0])
                for row in queue.query(
                    "SELECT invocation_id FROM loop_actors_queue WHERE holder = ? "
                    "AND status = 'claimed'",
                    (victim_id,),
                )
            ]
            return bool(held)

        wait_for(
            lambda: victim_holds() and len(held) == args.concurrency, 60, "the victim's claims"
        )
        # A backlog of new invocations, submitted before the kill: the other worker fills
        # its slots with them, and as each slot frees it chooses between the backlog and
        # the dead worker's runs (taken over first).
        trio.run(submit, db, args.backlog, "b-")
        other = worker_process(db, 2 * args.concurrency, args.lease_s, delay)
        wait_for(lambda: queue.holders() == 2, 60, "the other worker to register")
        victim_holds()
        victim.send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        moved = time_moves(queue, held, victim_id, killed, args.lease_s * 4 + 30)
        wait_for(lambda: queue.not_ended() == 0, 600, "every invocation to end")
    finally:
        stop_all([victim] if other is None else [victim, other])
    return {
        "held": len(held),
        "max_s": max(moved.values()),
        "median_s": statistics.median(moved.values()),
    }


def claimed_by(queue: Queue, holder: str) -> list[str]:
    return [
        str(row[0])
        for row in queue.query(
            "SELECT invocation_id FROM loop_actors_queue WHERE holder = ? AND status = 'claimed'",
            (holder,),
        )
    ]


def holder_ids(queue: Queue) -> set[str]:
    return {str(row[0]) for row in queue.query("SELECT holder FROM loop_actors_holders")}


def registered(
    queue: Queue, process: subprocess.Popen[str], before: set[str]
) -> tuple[subprocess.Popen[str], str]:
    """Wait for a worker started after ``before`` was read to register: its holder id."""
    found: list[str] = []

    def appeared() -> bool:
        found[:] = sorted(holder_ids(queue) - before)
        return bool(found) or process.poll() is not None

    wait_for(appeared, 60, "a new worker to register")
    if not found:
        raise SystemExit(f"a worker exited at start: {process.communicate()[1]}")
    return process, found[0]


def claims_of(queue: Queue, holder: str) -> list[str]:
    """The runs ``holder`` holds, once it holds one."""
    deadline = time.monotonic() + 60
    while not (held := claimed_by(queue, holder)):
        if time.monotonic() > deadline:
            raise SystemExit(f"{holder} claimed nothing")
        time.sleep(0.02)
    return held


def chaos(args: argparse.Namespace) -> dict[str, Any]:
    """Three workers, a random one SIGKILLed ``--kills`` times (each replaced)."""
    slots = 3 * args.concurrency
    submitted = 0
    db = fresh_db(args, f"bench-workers-chaos-{os.getpid()}.db")
    queue = Queue(db)
    delay = max(args.delay, 0.5)  # long enough that a worker holds runs when it is killed

    def top_up() -> None:
        nonlocal submitted
        waiting = queue.query("SELECT COUNT(*) FROM loop_actors_queue WHERE status = 'runnable'")
        if not waiting or int(waiting[0][0]) < 2 * slots:
            trio.run(submit, db, 4 * slots, f"c{submitted}-")
            submitted += 4 * slots

    started: list[subprocess.Popen[str]] = []

    def start() -> subprocess.Popen[str]:
        started.append(
            worker_process(
                db, args.concurrency, args.lease_s, delay, other_machine=args.other_machine
            )
        )
        return started[-1]

    rng = random.Random(args.seed)
    top_up()
    workers: list[tuple[subprocess.Popen[str], str]] = []
    moved: list[float] = []
    try:
        for _ in range(3):
            workers.append(registered(queue, start(), holder_ids(queue)))
        for _ in range(args.kills):
            top_up()
            victim, victim_id = rng.choice(workers)
            held = claims_of(queue, victim_id)
            send(victim, signal.SIGKILL)
            killed = time.perf_counter()
            before = holder_ids(queue)
            replacement = start()  # it registers while the others take the runs over
            victim.wait(timeout=30)
            workers.remove((victim, victim_id))
            moved += time_moves(queue, held, victim_id, killed, args.lease_s * 4 + 30).values()
            workers.append(registered(queue, replacement, before))
            time.sleep(rng.uniform(0.5, 2.0))
    finally:
        stop_all(started)
    return {
        "kills": args.kills,
        "held": len(moved),
        "median_s": statistics.median(moved),
        "max_s": max(moved),
        "submitted": submitted,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--lease-s", type=float, default=5.0)
    parser.add_argument("--kill", action="store_true", help="also measure recovery after SIGKILL")
    parser.add_argument(
        "--backlog",
        type=int,
        help="new invocations waiting when the worker is killed (default: 4 x --concurrency)",
    )
    parser.add_argument(
        "--kills",
        type=int,
        default=1,
        help="with --kill: SIGKILL a random one of three workers this many times (default 1: "
        "the single kill above)",
    )
    parser.add_argument(
        "--other-machine",
        action="store_true",
        help="with --kills: each worker in its own PID namespace (unshare): leases must run out",
    )
    parser.add_argument("--seed", type=int, default=33, help="which workers --kills kills")
    parser.add_argument("--db", help="a postgresql:// URL (default: a SQLite file in --dir)")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.n, args.workers, args.kill = 60, "1,2", True
    if args.backlog is None:
        args.backlog = 4 * args.concurrency
    counts = [int(w) for w in args.workers.split(",")]
    store = "PostgreSQL" if args.db and args.db.startswith("postgresql") else "SQLite"
    print(
        f"workload: {args.n} invocations of {T} turns, model delay {args.delay * 1000:.0f} ms, "
        f"concurrency {args.concurrency} per worker, lease {args.lease_s:g} s, on {store}"
    )
    baseline: float | None = None
    for workers in counts:
        figures = throughput(args, workers)
        baseline = baseline or figures["invocations_per_s"]
        print(
            f"{workers} worker(s): {figures['invocations_per_s']:7.1f} invocations/s, "
            f"{figures['turns_per_s']:7.1f} turns/s, submit->first turn p50 "
            f"{figures['p50_ms']:.0f} ms p99 {figures['p99_ms']:.0f} ms, "
            f"ratio to 1 worker {figures['invocations_per_s'] / baseline:.2f} "
            f"({args.n}/{args.n} ended in {figures['seconds']:.1f} s)"
        )
    idle = idle_latency(args)
    print(
        f"submit->first turn on an idle worker ({idle['count']} submitted one at a time): "
        f"p50 {idle['p50_ms']:.0f} ms p99 {idle['p99_ms']:.0f} ms (model delay "
        f"{args.delay * 1000:.0f} ms, poll every 100 ms)"
    )
    if args.kill and args.kills > 1:
        figures = chaos(args)
        print(
            f"recovery after {figures['kills']} SIGKILLs of a random one of 3 workers "
            f"(concurrency {args.concurrency} each, {figures['submitted']} invocations, "
            f"{'each worker in its own PID namespace' if args.other_machine else 'one machine'}"
            f"): {figures['held']} invocation(s) of the killed workers moved again after "
            f"median {figures['median_s']:.2f} s, max {figures['max_s']:.2f} s "
            f"(lease {args.lease_s:g} s, poll 0.1 s; target <= lease + poll + one turn)"
        )
    elif args.kill:
        figures = recovery(args)
        print(
            f"recovery after SIGKILL: {figures['held']} invocation(s) of the killed worker moved "
            f"again after median {figures['median_s']:.2f} s, max {figures['max_s']:.2f} s "
            f"with {args.backlog} new invocation(s) waiting (lease {args.lease_s:g} s; "
            f"target <= lease + one turn + 1 s)"
        )


if __name__ == "__main__":
    main()
