"""Worker processes on one store, the workload of bench/concurrency.py: turns/s for W workers.

The workload is bench/concurrency.py's, imported from it (its agent, its
``TimedModel`` around ``ScriptedModel(decide, delay_s=DELAY)``, T=5 turns, K=3
parallel instant reads in turns 1-4): N invocations at once, each model decision
taking DELAY seconds. For each number of workers W, W worker processes (this
script with ``--as-worker``: a ``loop_actors.Worker`` of ``--concurrency C``, by
default N/W so that all N are in flight at once) are started on a fresh store and
register; then N invocations are submitted at once from this process
(``Runtime.submit``, one task each), and the script waits until every queue row
has ended.

It prints turns/s from the first claim to the last ``Terminated`` (the store's
timestamps), the submit burst's length, the claim latency (a row's
``submitted_at`` to its claim, p50/p99), and for each worker: the invocations and
turns it drove, its process CPU (user + system, every thread) per turn over its
busy window (first claim to the end of its last run) and the trio thread's, the
cyclic collector's share, the Journal's durable commits, transactions and commits
per transaction, its queue transactions (write / read), claims (and invocations
per claim), lease renewals (rows renewed) and releases, and its peak RSS. Then
it reads every invocation back and checks that it completed with the right
answer, with contiguous versions and the expected events.

    python bench/worker_throughput.py [--n 2000] [--delay 1.0] [--workers 1,2,4]
                                      [--concurrency C] [--db URL] [--dir /tmp]
                                      [--gc-threshold 100000,20,100]
    python bench/worker_throughput.py --quick     # --n 200 --delay 0.2 --workers 1,2

``--db postgresql://...`` runs on PostgreSQL (the queue tables are dropped before
each W; invocation ids are unique per run); the default is a SQLite file in
``--dir``. ``--gc-threshold`` sets ``gc.set_threshold`` in the worker processes.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from concurrency import (  # noqa: E402
    COLLECTOR,
    COMMITS_PER_INVOCATION,
    TOOLS,
    CommitCounter,
    TimedModel,
    check_workload,
    cpu_s,
    make_agent,
    peak_rss_mb,
    percentile,
)
from machine_speed import describe as describe_machine  # noqa: E402
from turn_overhead import K, T  # noqa: E402
from workers import Queue, fresh_db, wait_for  # noqa: E402

import loop_actors.store.queue as queue_module  # noqa: E402
from loop_actors import Agent, EventStore, Runtime, Worker  # noqa: E402
from loop_actors.runtime.leases import LeaseKeeper  # noqa: E402

EVENTS_PER_INVOCATION = 1 + 3 * (T - 1) + 2
"""Started; decision, dispatch and results in turns 1-4; decision and Terminated."""

# --------------------------------------------------------------------------- worker side


class WorkerProbe:
    """What one worker process did, counted from this script (the library is not changed)."""

    def __init__(self) -> None:
        self.commits = CommitCounter()
        self.claimed_at: dict[str, float] = {}
        self.claims = 0
        self.renewals = 0
        self.renewed_rows = 0
        self.releases = 0
        self.release_calls = 0
        self.queue_writes = 0
        self.queue_reads = 0
        self.first_claim = 0.0
        self.last_end = 0.0
        self.cpu_first = self.cpu_last = 0.0
        self.trio_first = self.trio_last = 0.0
        self.gc_first = self.gc_last = 0.0

    def install(self) -> None:
        self.commits.install()
        probe = self
        claim = LeaseKeeper.claim

        async def counting_claim(
            keeper: LeaseKeeper, agent_names: list[str], limit: int
        ) -> list[Any]:
            got = await claim(keeper, agent_names, limit)
            if got:
                now = time.time()
                if not probe.claimed_at:
                    probe.first_claim = now
                    probe.cpu_first, probe.trio_first = cpu_s(), time.thread_time()
                    probe.commits.reset()
                    probe.queue_writes = probe.queue_reads = probe.renewals = 0
                    probe.renewed_rows = probe.releases = probe.release_calls = 0
                    COLLECTOR.on = True
                    probe.gc_first = sum(COLLECTOR.seconds)
                probe.claims += 1
                for _, claimed in got:
                    probe.claimed_at[claimed.invocation_id] = now
            return got

        LeaseKeeper.claim = counting_claim  # type: ignore[assignment,method-assign]

        drive = Worker._drive

        async def timed_drive(worker: Worker, lease: Any, claim: Any, *more: Any) -> None:
            try:
                await drive(worker, lease, claim, *more)
            finally:
                probe.last_end = time.time()
                probe.cpu_last, probe.trio_last = cpu_s(), time.thread_time()
                probe.gc_last = sum(COLLECTOR.seconds)

        Worker._drive = timed_drive  # type: ignore[assignment,method-assign]

        renew = queue_module.WorkQueue.renew

        def counting_renew(queue: queue_module.WorkQueue, **kwargs: Any) -> set[str]:
            probe.renewals += 1
            probe.renewed_rows += len(kwargs["leases"])
            return renew(queue, **kwargs)

        queue_module.WorkQueue.renew = counting_renew  # type: ignore[assignment,method-assign]

        # Releases: one row a call before the queue grouped them (release), many after.
        grouped = hasattr(queue_module.WorkQueue, "release_many")
        name = "release_many" if grouped else "release"
        release = getattr(queue_module.WorkQueue, name)

        def counting_release(queue: queue_module.WorkQueue, *args: Any, **kwargs: Any) -> Any:
            probe.release_calls += 1
            probe.releases += len(kwargs.get("leases", args[0] if args else ())) if grouped else 1
            return release(queue, *args, **kwargs)

        setattr(queue_module.WorkQueue, name, counting_release)

        tx = queue_module.WorkQueue._tx

        @contextlib.contextmanager
        def counting_tx(
            queue: queue_module.WorkQueue, *, write: bool = True, **options: Any
        ) -> Iterator[tuple[Any, float]]:
            if write:
                probe.queue_writes += 1
            else:
                probe.queue_reads += 1
            with tx(queue, write=write, **options) as opened:
                yield opened

        queue_module.WorkQueue._tx = counting_tx  # type: ignore[assignment,method-assign]

    def report(self, worker_id: str) -> dict[str, Any]:
        return {
            "worker_id": worker_id,
            "claimed_at": self.claimed_at,
            "claims": self.claims,
            "renewals": self.renewals,
            "renewed_rows": self.renewed_rows,
            "releases": self.releases,
            "release_calls": self.release_calls,
            "queue_writes": self.queue_writes,
            "queue_reads": self.queue_reads,
            "first_claim": self.first_claim,
            "last_end": self.last_end,
            "cpu_s": self.cpu_last - self.cpu_first,
            "trio_cpu_s": self.trio_last - self.trio_first,
            "gc_s": self.gc_last - self.gc_first,
            "commit_requests": self.commits.requests,
            "transactions": self.commits.transactions,
            "largest": self.commits.largest,
            "peak_rss_mb": peak_rss_mb(),
        }


async def serve(args: argparse.Namespace) -> dict[str, Any]:
    probe = WorkerProbe()
    probe.install()
    worker = Worker(
        make_agent(TimedModel(args.delay), args.tool),
        args.db,
        concurrency=args.concurrency,
        lease_s=args.lease_s,
        grace_s=5,
    )
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                async for _ in signals:
                    worker.stop()

            nursery.start_soon(on_signal)
            await worker.run()
            nursery.cancel_scope.cancel()
    return probe.report(worker.worker_id)


# --------------------------------------------------------------------------- the run


def start_worker(args: argparse.Namespace, db: str, concurrency: int, report: Path) -> Any:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--as-worker",
        "--db",
        db,
        "--concurrency",
        str(concurrency),
        "--delay",
        str(args.delay),
        "--tool",
        args.tool,
        "--lease-s",
        str(args.lease_s),
        "--report",
        str(report),
    ]
    if args.gc_threshold:
        command += ["--gc-threshold", args.gc_threshold]
    # Its log goes to a file: a pipe nobody reads until the end could fill and block it.
    log = report.with_suffix(".log").open("w")
    return subprocess.Popen(command, cwd=HERE, stdout=subprocess.DEVNULL, stderr=log)


async def submit_all(db: str, ids: list[str], kind: str = "async") -> None:
    agent = make_agent(TimedModel(0.0), kind)
    async with Runtime(db) as runtime, trio.open_nursery() as nursery:
        for invocation_id in ids:
            nursery.start_soon(submit_one, runtime, agent, invocation_id)


async def submit_one(runtime: Runtime, agent: Agent, invocation_id: str) -> None:
    """Submit one invocation whose goal is its id (the scripted answer names it)."""
    await runtime.submit(agent, invocation_id, invocation_id=invocation_id)


def check(db: str, ids: list[str]) -> tuple[list[str], float]:
    """Read every invocation back: the problems found, and the last Terminated's time."""
    store = EventStore(db, create=False)
    problems: list[str] = []
    last = 0.0
    try:
        for invocation_id in ids:
            events = store.events(invocation_id)
            versions = [event.originator_version for event in events]
            if versions != list(range(versions[0], versions[0] + len(versions))):
                problems.append(f"{invocation_id}: versions {versions}")
            kinds = [type(event).__name__ for event in events]
            if len(events) != EVENTS_PER_INVOCATION or kinds[-1] != "Terminated":
                problems.append(f"{invocation_id}: events {kinds}")
                continue
            final = events[-1]
            expected = f"{invocation_id}: n={K * (T - 1)}"
            if getattr(final, "reason", None) != "completed" or (
                getattr(final, "answer", None) != expected
            ):
                problems.append(f"{invocation_id}: {final!r}")
            last = max(last, final.timestamp.timestamp())
    finally:
        store.close()
    return problems, last


def run_workers(args: argparse.Namespace, workers: int, n: int) -> dict[str, Any]:
    run_id = f"{workers}-{os.getpid()}"
    db = fresh_db(args, f"bench-worker-throughput-{run_id}.db")
    queue = Queue(db)
    trio.run(submit_all, db, [])  # creates the store and its tables
    concurrency = args.concurrency or math.ceil(n / workers)
    reports = [Path(args.dir) / f"worker-throughput-{run_id}-{w}.json" for w in range(workers)]
    processes = [start_worker(args, db, concurrency, report) for report in reports]
    ids = [f"g{run_id}-{i:05d}" for i in range(n)]
    try:
        wait_for(lambda: queue.holders() == workers, 120, "the workers to register")
        started = time.time()
        trio.run(submit_all, db, ids, args.tool)
        submitted = time.time()
        wait_for(lambda: queue.not_ended() == 0, 1200, "every invocation to end")
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(timeout=120)
        for process, report in zip(processes, reports, strict=True):
            log = report.with_suffix(".log")
            lines = log.read_text().splitlines()
            log.unlink()
            if lines:
                print(f"  worker log ({len(lines)} lines): " + "\n".join(lines[:20]))
            if process.returncode != 0:
                raise SystemExit(f"a worker exited with {process.returncode}")
    figures = [json.loads(report.read_text()) for report in reports]
    for report in reports:
        report.unlink()
    marks = ",".join("?" * len(ids))
    submitted_at = dict(
        queue.query(
            f"SELECT invocation_id, submitted_at FROM loop_actors_queue "  # noqa: S608
            f"WHERE invocation_id IN ({marks})",
            tuple(ids),
        )
    )
    problems, last_end = check(db, ids)
    claims = {i: t for figure in figures for i, t in figure["claimed_at"].items()}
    first_claim = min(f["first_claim"] for f in figures if f["claimed_at"])
    latencies = sorted(claims[i] - float(submitted_at[i]) for i in ids if i in claims)
    return {
        "concurrency": concurrency,
        "submit_s": submitted - started,
        "window_s": last_end - first_claim,
        "latencies": latencies,
        "figures": figures,
        "problems": problems,
        "unclaimed": len(set(ids) - set(claims)),
    }


def print_run(workers: int, n: int, run: dict[str, Any]) -> None:
    window = run["window_s"]
    turns = n * T
    latencies = run["latencies"]
    total_cpu = sum(f["cpu_s"] for f in run["figures"])
    print(
        f"{workers} worker(s), concurrency {run['concurrency']} each: "
        f"{turns / window:,.0f} turns/s ({turns:,} turns from the first claim to the last "
        f"Terminated in {window:.2f} s; floor {T * run['delay']:g} s); "
        f"submit of {n:,} took {run['submit_s']:.2f} s"
    )
    print(
        f"  CPU per turn, all workers: {total_cpu / turns * 1e6:,.0f} us "
        f"({total_cpu:.2f} s of process CPU)"
    )
    if latencies:
        print(
            "  claim latency (submitted -> claimed): "
            f"p50 {percentile(latencies, 0.5) * 1e3:,.0f} ms"
            f", p99 {percentile(latencies, 0.99) * 1e3:,.0f} ms, max {latencies[-1] * 1e3:,.0f} ms"
        )
    for number, f in enumerate(run["figures"]):
        driven = len(f["claimed_at"])
        wturns = max(driven * T, 1)
        print(
            f"  worker {number}: {driven:,} invocations, "
            f"busy {f['last_end'] - f['first_claim']:.2f} s"
            f"; CPU per turn {f['cpu_s'] / wturns * 1e6:,.0f} us (trio thread "
            f"{f['trio_cpu_s'] / wturns * 1e6:,.0f}, collector {f['gc_s'] / wturns * 1e6:,.0f}); "
            f"peak RSS {f['peak_rss_mb']:.0f} MB"
        )
        print(
            f"    durable commits {f['commit_requests']:,} in {f['transactions']:,} transactions "
            f"({f['commit_requests'] / max(f['transactions'], 1):.1f} per transaction, largest "
            f"{f['largest']}); queue transactions {f['queue_writes']:,} write / "
            f"{f['queue_reads']:,} read; claims {f['claims']:,} "
            f"({driven / max(f['claims'], 1):.1f} invocations each); renewals "
            f"{f['renewals']:,} ({f['renewed_rows']:,} rows); releases {f['releases']:,} in "
            f"{f.get('release_calls', f['releases']):,} calls"
        )
    expected = n * (COMMITS_PER_INVOCATION - 1)
    commits = sum(f["commit_requests"] for f in run["figures"])
    print(
        f"  outcomes: {n - len(run['problems']) - run['unclaimed']}/{n} completed with the right "
        f"answer and {EVENTS_PER_INVOCATION} contiguous events; worker commits {commits:,} "
        f"({expected:,} expected)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=None, help="invocations at once (2000)")
    parser.add_argument("--delay", type=float, default=None, help="model latency, s (1.0)")
    parser.add_argument("--workers", default=None, help="worker counts (1,2,4)")
    parser.add_argument("--concurrency", type=int, default=0, help="per worker (N/W)")
    parser.add_argument("--lease-s", type=float, default=30.0)
    parser.add_argument("--db", help="a postgresql:// URL (default: a SQLite file in --dir)")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--gc-threshold", default="", help="gc.set_threshold in the workers")
    parser.add_argument("--quick", action="store_true", help="--n 200 --delay 0.2 --workers 1,2")
    parser.add_argument(
        "--tool", choices=sorted(TOOLS), default="async", help="lookup: async (default) or inline"
    )
    parser.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gc_threshold:
        gc_threshold = tuple(int(part) for part in args.gc_threshold.split(","))
    if args.as_worker:
        if args.gc_threshold:
            gc.set_threshold(*gc_threshold)
        report = trio.run(serve, args)
        Path(args.report).write_text(json.dumps(report))
        return
    n = args.n if args.n is not None else (200 if args.quick else 2000)
    args.delay = args.delay if args.delay is not None else (0.2 if args.quick else 1.0)
    check_workload(parser, n, args.delay)
    try:
        counts = [int(w) for w in (args.workers or ("1,2" if args.quick else "1,2,4")).split(",")]
    except ValueError:
        parser.error(f"--workers must be whole numbers separated by commas, not {args.workers!r}")
    if any(count < 1 for count in counts):
        parser.error(f"--workers must each be at least 1, not {args.workers!r}")
    store = "PostgreSQL" if args.db and args.db.startswith("postgresql") else "SQLite"
    print(
        f"workload: {n} invocations at once x {T} turns, {K} parallel instant reads "
        f"({args.tool}) in turns 1-{T - 1}, model latency {args.delay:g} s per decision, on "
        f"{store}, worker processes "
        f"with lease {args.lease_s:g} s"
        + (f", gc threshold {args.gc_threshold} in the workers" if args.gc_threshold else "")
        + f"; load average {os.getloadavg()[0]:.1f}"
    )
    print(describe_machine())
    failed = False
    for workers in counts:
        run = run_workers(args, workers, n)
        run["delay"] = args.delay
        print_run(workers, n, run)
        for line in run["problems"][:10]:
            print(f"    {line}")
        failed = failed or bool(run["problems"] or run["unclaimed"])
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
