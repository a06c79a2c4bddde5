"""Many invocations at once in one process: throughput and the effect of group commit.

The workload of bench/turn_overhead.py (T=5 turns; turns 1-4 ask for K=3
parallel calls of an instant read-only ``lookup``; turn 5 answers), but every
model decision takes DELAY seconds of simulated latency (``ScriptedModel(...,
delay_s=DELAY)``, a ``trio.sleep``), and N invocations run at the same time in
one trio nursery inside one ``async with Runtime(url)``, on one SQLite file.
One untimed warm-up invocation (no model delay) runs first on the same file.

Commits are counted by wrapping ``loop_actors.store.journal.commit_group`` from this
script (the wrapper only counts; the library is not changed): each call that
returns is one transaction, and the commits it answers are the commit requests of
the controllers (10 per invocation: start, dispatch + results in turns 1-4, final).

Besides throughput it reports what decides how many invocations a process can
host: the CPU time per turn (the process's user + system CPU over the timed run,
all threads, divided by the turns; and the trio thread's alone), the time a turn
adds beyond the model's latency (turn i of an invocation lasts from the start of
its model call i to the start of model call i+1, turn 1 from the call of
``Runtime.run`` and the last turn until ``run`` returns; what it adds is that
length minus DELAY; p50 and p99 over every turn), the spread of each round of
model calls (round k: every invocation's call k, from the first start to the last:
a round's replies come back as spread as its calls, and the next round's spread is at
least the time the process took to work through them), how long the trio thread waited
for I/O with nothing to run (a trio instrument timing each wait, ``before_io_wait`` to
``after_io_wait``): before the first model reply came back, and after it, as a share
of the rest of the run (the share left idle in a run bound by the process's CPU is
small; a large one says the runs waited for their model and commits), and the RSS per in-flight
invocation (peak RSS minus the RSS of the open runtime after the warm-up,
divided by N).

    python bench/concurrency.py [--n 2000] [--delay 1.0] [--dir /tmp]
    python bench/concurrency.py --n 10000 --delay 2.0
    python bench/concurrency.py --quick          # --n 200 --delay 0.2

With ``--mode seq|conc --db FILE --out JSON`` it follows the script contract of
the peer benchmark (shared/bench-peers, README "Adding a new runtime"): instant
model, N one after another (seq) or all at once (conc), JSON on stdout and in
FILE. For example:

    ./run_all.sh --extra 'loop_actors=/path/.venv/bin/python /path/bench/concurrency.py'
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()  # before the runtime is imported, as the peers' common.py does

import argparse  # noqa: E402
import gc  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import sqlite3  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from functools import partial  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import trio  # noqa: E402
from machine_speed import describe as describe_machine  # noqa: E402
from turn_overhead import K, T, db_bytes, decide, lookup, lookup_value  # noqa: E402

import loop_actors.store.journal as journal_module  # noqa: E402
from loop_actors import (  # noqa: E402
    Agent,
    Budget,
    ModelReply,
    ModelRequest,
    Runtime,
    ScriptedModel,
    Tool,
    tool,
)
from loop_actors._messages import CommitOutcome  # noqa: E402

COMMITS_PER_INVOCATION = 1 + 2 * (T - 1) + 1
WARMUP = 1


class CommitCounter:
    """Counts the Journal's transactions and the commit requests they carry, and times them."""

    def __init__(self) -> None:
        self.transactions = 0
        self.requests = 0
        self.largest = 0
        self.seconds: list[float] = []
        self._original = journal_module.commit_group

    def install(self) -> None:
        def counting(
            store: journal_module.Appender, group: list[journal_module.Commit], **options: Any
        ) -> list[CommitOutcome]:
            # Counted once it returns: a commit tried inline that found the store
            # locked leaves it raising, and is written (and counted) by the thread.
            started = time.perf_counter()
            results = self._original(store, group, **options)
            self.seconds.append(time.perf_counter() - started)
            self.transactions += 1
            self.requests += len(results)
            self.largest = max(self.largest, len(results))
            return results

        journal_module.commit_group = counting

    def reset(self) -> None:
        self.transactions = self.requests = self.largest = 0
        self.seconds = []


@dataclass
class Run:
    """What one timed run measured."""

    wall_s: float = 0.0
    started_s: float = 0.0
    """When the timed invocations started (``perf_counter``)."""
    ready_s: float = 0.0
    rss_after_setup_mb: float = 0.0
    rss_before_mb: float = 0.0
    """RSS after the warm-up, just before the timed invocations start."""
    cpu_s: float = 0.0
    """Process CPU (user + system, every thread) over the timed run."""
    trio_cpu_s: float = 0.0
    """CPU of the trio thread alone over the timed run."""
    latencies: list[float] = field(default_factory=list)
    added: list[float] = field(default_factory=list)
    """Per turn: its length minus the model's latency."""
    calls: list[list[float]] = field(default_factory=list)
    """Per invocation: when each of its model calls started (``perf_counter``)."""
    failures: list[str] = field(default_factory=list)
    waits: list[tuple[float, float]] = field(default_factory=list)
    """Each wait of the trio thread for I/O: (start, seconds), ``perf_counter``."""


class IoWaits(trio.abc.Instrument):
    """Times each wait of the trio thread for I/O (nothing else to run meanwhile)."""

    def __init__(self, waits: list[tuple[float, float]]) -> None:
        self.waits = waits
        self.started = 0.0

    def before_io_wait(self, timeout: float) -> None:
        self.started = time.perf_counter()

    def after_io_wait(self, timeout: float) -> None:
        now = time.perf_counter()
        self.waits.append((self.started, now - self.started))


def idle_split(waits: Sequence[tuple[float, float]], cut: float) -> tuple[float, float]:
    """The seconds of waiting before ``cut`` and after it (a wait across it split)."""
    before = after = 0.0
    for start, seconds in waits:
        end = start + seconds
        before += max(0.0, min(end, cut) - start)
        after += max(0.0, end - max(start, cut))
    return before, after


class CollectorClock:
    """CPU time the cyclic garbage collector spends, by generation (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0
        self.on = False

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._started = time.thread_time()
            return
        generation = info["generation"]
        self.collections[generation] += 1
        self.seconds[generation] += time.thread_time() - self._started


COLLECTOR = CollectorClock()
gc.callbacks.append(COLLECTOR)


class TimedModel:
    """The scripted model, noting when each of its calls starts (by goal)."""

    def __init__(self, delay_s: float) -> None:
        self.inner = ScriptedModel(decide, delay_s=delay_s)
        self.starts: dict[str, list[float]] = {}

    async def decide(self, request: ModelRequest) -> ModelReply:
        self.starts.setdefault(request.goal, []).append(time.perf_counter())
        return await self.inner.decide(request)


@tool(name="lookup", inline=True)
def lookup_inline(key: str) -> dict[str, Any]:
    """Return a small record at once."""
    return lookup_value(key)


TOOLS: dict[str, Tool] = {"async": lookup, "inline": lookup_inline}
"""``--tool``: the workload's ``lookup`` as an async function (the default, as in every
figure before session 6 of issue 17), or as a plain function run inline (what the peer
benchmark's workload names: "the tool is a plain def", each runtime running it its own
way)."""


def make_agent(model: TimedModel, kind: str = "async") -> Agent:
    return Agent(
        "bench-concurrency",
        model,
        [TOOLS[kind]],
        Budget(max_steps=T, max_tool_calls=K * (T - 1)),
    )


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_now_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def run_all(
    path: Path,
    n: int,
    delay_s: float,
    counter: CommitCounter,
    at_once: bool = True,
    *,
    kind: str = "async",
) -> Run:
    """Run n invocations, all at once (or one after another), after an untimed warm-up."""
    model = TimedModel(delay_s)
    agent = make_agent(model, kind)
    run = Run()

    async def one(runtime: Runtime, goal: str, agent: Agent = agent) -> None:
        started = time.perf_counter()
        outcome = await runtime.run(agent, goal)
        ended = time.perf_counter()
        run.latencies.append(ended - started)
        expected = f"{goal}: n={K * (T - 1)}"
        if outcome.reason != "completed" or outcome.answer != expected:
            run.failures.append(f"{goal}: {outcome.reason} {outcome.answer!r}")
        starts = model.starts.pop(goal, [])
        run.calls.append(starts)
        bounds = [started, *starts[1:], ended]
        run.added.extend(b - a - delay_s for a, b in itertools.pairwise(bounds))

    async with Runtime(f"sqlite:///{path}") as runtime:
        run.ready_s = time.perf_counter()
        run.rss_after_setup_mb = rss_now_mb()
        for i in range(WARMUP):
            # untimed: no model delay
            await one(runtime, f"warm-{i:05d}", make_agent(TimedModel(0.0), kind))
        run.latencies.clear()
        run.added.clear()
        run.calls.clear()
        if run.failures:
            return run
        counter.reset()
        run.rss_before_mb = rss_now_mb()
        cpu_before, trio_cpu_before = cpu_s(), time.thread_time()
        COLLECTOR.on = True
        waits = IoWaits(run.waits)
        trio.lowlevel.add_instrument(waits)
        started = time.perf_counter()
        if at_once:
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(one, runtime, f"g-{i:05d}")
        else:
            for i in range(n):
                await one(runtime, f"g-{i:05d}")
        run.wall_s = time.perf_counter() - started
        trio.lowlevel.remove_instrument(waits)
        run.started_s = started
        run.cpu_s = cpu_s() - cpu_before
        run.trio_cpu_s = time.thread_time() - trio_cpu_before
        COLLECTOR.on = False
    return run


def check_workload(parser: argparse.ArgumentParser, n: int, delay: float) -> None:
    """Refuse (exit 2) a workload that cannot be measured: no invocations, a bad latency."""
    if n < 1:
        parser.error(f"--n must be at least 1, not {n}")
    if not (math.isfinite(delay) and delay >= 0):
        parser.error(f"--delay must be a finite number of seconds >= 0, not {delay}")


def round_spreads(calls: list[list[float]]) -> list[float]:
    """For each round k (every invocation's model call k), first start to last start.

    With every invocation started at once, round 1's spread is the start's; a round's
    replies come back spread as its calls were, and the next round's spread is how long
    the process took to work through them (at least that).
    """
    rounds = min((len(starts) for starts in calls), default=0)
    return [
        max(starts[k] for starts in calls) - min(starts[k] for starts in calls)
        for k in range(rounds)
    ]


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """The value at ``fraction`` of a sorted list (nearest rank)."""
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def peer_contract(args: argparse.Namespace, counter: CommitCounter) -> None:
    """The peer benchmark's script contract: instant model, JSON result."""
    path = Path(args.db)
    for leftover in path.parent.glob(path.name + "*"):
        leftover.unlink()
    at_once = args.mode == "conc"
    run = trio.run(partial(run_all, kind=args.tool), path, args.n, 0.0, counter, at_once)
    size = db_bytes(path)
    wrong = [line for line in run.failures if ": completed " in line]
    payload: dict[str, Any] = {
        "name": "loop_actors",
        "mode": args.mode,
        "tool": args.tool,
        "n": args.n,
        "warmup": WARMUP,
        "T": T,
        "K": K,
        "wall_s": run.wall_s,
        "per_turn_us": run.wall_s / (args.n * T) * 1e6,
        "per_invocation_ms": run.wall_s / args.n * 1e3,
        "startup_s": run.ready_s - _T0,
        "rss_after_setup_mb": run.rss_after_setup_mb,
        "peak_rss_mb": peak_rss_mb(),
        "db_bytes": size,
        "db_bytes_per_invocation": size / (args.n + WARMUP),
        "db_files": [str(path)],
        "pragmas": {"journal_mode": journal_mode(path)},
        "ok": len(run.latencies) - len(run.failures),
        "wrong": len(wrong),
        "errors": len(run.failures) - len(wrong),
        "error_sample": run.failures[:3],
        "cpu_per_turn_us": run.cpu_s / (args.n * T) * 1e6,
        "commit_requests": counter.requests,
        "transactions": counter.transactions,
        "versions": {
            "python": sys.version.split()[0],
            "sqlite": sqlite3.sqlite_version,
            **{d: version(d) for d in ("loop-actors", "eventsourcing", "pydantic", "trio")},
        },
        "notes": "loop-actors Runtime, one Journal (group commit), trio",
        "loop_actors_from": str(Path(journal_module.__file__).resolve().parent.parent),
    }
    text = json.dumps(payload, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


def journal_mode(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=None, help="invocations at once (2000)")
    parser.add_argument("--delay", type=float, default=None, help="model latency, s (1.0)")
    parser.add_argument("--quick", action="store_true", help="--n 200 --delay 0.2 unless given")
    parser.add_argument("--dir", default=None, help="where the database file goes")
    parser.add_argument(
        "--tool", choices=sorted(TOOLS), default="async", help="lookup: async (default) or inline"
    )
    parser.add_argument("--mode", choices=["seq", "conc"], help="peer benchmark contract")
    parser.add_argument("--db", default="", help="peer contract: the SQLite file")
    parser.add_argument("--out", default="", help="peer contract: the JSON result file")
    args = parser.parse_args()

    counter = CommitCounter()
    counter.install()
    if args.mode is not None:
        if not args.db:
            parser.error("--mode needs --db")
        args.n = args.n if args.n is not None else 200
        check_workload(parser, args.n, 0.0)
        peer_contract(args, counter)
        return

    n: int = args.n if args.n is not None else (200 if args.quick else 2000)
    delay: float = args.delay if args.delay is not None else (0.2 if args.quick else 1.0)
    check_workload(parser, n, delay)
    machine = describe_machine()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "concurrency.db"
        run = trio.run(partial(run_all, kind=args.tool), path, n, delay, counter)
        size = db_bytes(path)

    floor = T * delay
    turns = n * T
    expected_requests = n * COMMITS_PER_INVOCATION
    latencies = sorted(run.latencies)
    wall = run.wall_s
    print(
        f"workload: {n} invocations at once x {T} turns, {K} parallel instant reads "
        f"({args.tool}) in turns 1-{T - 1}, model latency {delay:g} s per decision "
        f"(floor {floor:g} s)"
    )
    print(machine)
    if run.failures or len(latencies) != n:
        reasons = Counter(line.split(": ", 1)[1].split(" ", 1)[0] for line in run.failures)
        print(
            f"NOT MEASURED: {len(latencies) - len(run.failures)}/{n} invocations completed "
            f"({', '.join(f'{r} {c:,}' for r, c in reasons.most_common())}); the rates below "
            f"count {turns:,} turns, and fewer ran"
        )
    print(f"wall time: {wall:.2f} s ({wall - floor:+.2f} s over the floor)")
    if latencies:
        print(
            f"latency per invocation: median {statistics.median(latencies):.2f} s, "
            f"max {latencies[-1]:.2f} s"
        )
    print(f"turns per second: {turns / wall:,.0f}")
    print(
        f"CPU per turn: {run.cpu_s / turns * 1e6:,.0f} us (process, all threads: "
        f"{run.cpu_s:.2f} s for {turns:,} turns); "
        f"trio thread {run.trio_cpu_s / turns * 1e6:,.0f} us"
    )
    print(
        f"  of which the garbage collector: {sum(COLLECTOR.seconds) / turns * 1e6:,.0f} us "
        f"({sum(COLLECTOR.seconds):.2f} s; collections by generation "
        + ", ".join(
            f"{count:,} in {seconds:.2f} s"
            for count, seconds in zip(COLLECTOR.collections, COLLECTOR.seconds, strict=True)
        )
        + ")"
    )
    if run.added:
        added = sorted(run.added)
        print(
            f"time a turn adds beyond the model's {delay:g} s: "
            f"p50 {percentile(added, 0.5) * 1e3:,.1f} ms, "
            f"p99 {percentile(added, 0.99) * 1e3:,.1f} ms, max {added[-1] * 1e3:,.1f} ms"
        )
    spreads = round_spreads(run.calls)
    if spreads:
        print(
            "spread of each round's model calls (first to last start, s): "
            + ", ".join(f"{spread:.2f}" for spread in spreads)
        )
    first_calls = [starts[0] for starts in run.calls if starts]
    if first_calls:
        first_reply = min(first_calls) + delay
        before, after = idle_split(run.waits, first_reply)
        rest = run.started_s + wall - first_reply
        print(
            f"trio thread waiting for I/O: {before + after:.2f} s of the {wall:.2f} s; "
            f"{before:.2f} s before the first model reply, {after:.2f} s after it "
            f"({after / rest if rest > 0 else 0.0:.0%} of the {max(rest, 0.0):.2f} s left)"
        )
    print(
        f"durable commits: {counter.requests:,} ({expected_requests:,} expected), "
        f"{counter.requests / wall:,.0f} per second (commit requests, each answered once durable)"
    )
    print(
        f"durable transactions: {counter.transactions:,}, {counter.transactions / wall:,.1f} "
        f"per second"
    )
    print(
        f"group size: average {counter.requests / max(counter.transactions, 1):.1f} commits "
        f"per transaction, largest {counter.largest} (cap {journal_module.MAX_GROUP})"
    )
    if counter.seconds:
        ordered = sorted(counter.seconds)
        print(
            f"transaction time: median {statistics.median(ordered) * 1e3:.1f} ms, "
            f"90th percentile {ordered[int(0.9 * (len(ordered) - 1))] * 1e3:.1f} ms, "
            f"max {ordered[-1] * 1e3:.1f} ms"
        )
    print(f"bytes stored per invocation: {size / (n + WARMUP):,.0f}")
    peak = peak_rss_mb()
    print(
        f"peak RSS: {peak:.0f} MB ({run.rss_after_setup_mb:.0f} MB after the "
        f"runtime opened, {run.rss_before_mb:.0f} MB after the warm-up)"
    )
    print(
        f"RSS per in-flight invocation: {(peak - run.rss_before_mb) * 1024 / n:,.1f} KB "
        f"(peak minus the RSS after the warm-up, over {n:,})"
    )
    print(f"outcomes: {len(latencies) - len(run.failures)}/{n} completed with the right answer")
    if run.failures or len(latencies) != n or counter.requests != expected_requests:
        for line in run.failures[:10]:
            print(f"  {line}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
