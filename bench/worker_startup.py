"""How long a worker takes to start N claimed runs: from its start to each run's first model call.

N invocations of bench/concurrency.py's agent are submitted to a fresh SQLite store (untimed),
then one ``loop_actors.Worker`` of concurrency N is started in this process. Its model notes
when each run asks it for its first decision, and never answers (the runs wait there). The
script prints, for REPS workers in turn (each on a fresh store), the time from the worker's
start to the last run's first model call, that call's p10/median/p90/first, the process CPU
per run over that window (every thread), and when the worker's claims (``LeaseKeeper.claim``,
at most 1,024 rows each) started and ended.

What a claimed run does before its model call is the worker's part: the claim, the reads of
its invocation, its history check and its cancel request (one read for the batch since the
batch reads of issue 17, three a run before), the lease, the controller, the slot.

    python bench/worker_startup.py [--n 3000] [--reps 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from concurrency import TimedModel, make_agent  # noqa: E402
from turn_overhead import K, T, lookup  # noqa: E402

from loop_actors import Agent, Budget, ModelReply, ModelRequest, Runtime, Worker  # noqa: E402
from loop_actors.runtime.leases import LeaseKeeper  # noqa: E402


class FirstCalls:
    """A model that notes when each run first asks it, and makes every run wait there."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.at: list[float] = []
        self.all_asked = trio.Event()

    async def decide(self, request: ModelRequest) -> ModelReply:
        self.at.append(time.perf_counter())
        if len(self.at) == self.n:
            self.all_asked.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover


async def submit_all(url: str, n: int) -> None:
    agent = make_agent(TimedModel(0.0))
    async with Runtime(url) as runtime, trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(runtime.submit, agent, f"g-{i:05d}")


async def start_worker(url: str, n: int, claims: list[tuple[float, float, int]]) -> dict[str, Any]:
    model = FirstCalls(n)
    agent = Agent(
        "bench-concurrency", model, [lookup], Budget(max_steps=T, max_tool_calls=K * (T - 1))
    )
    worker = Worker(agent, url, concurrency=n)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run)
        started, cpu = time.perf_counter(), time.process_time()
        with trio.fail_after(600):
            await model.all_asked.wait()
        cpu = time.process_time() - cpu
        worker.stop_now()
        nursery.cancel_scope.cancel()
    firsts = sorted(at - started for at in model.at)
    return {
        "last": firsts[-1],
        "first": firsts[0],
        "p10": firsts[len(firsts) // 10],
        "median": statistics.median(firsts),
        "p90": firsts[9 * len(firsts) // 10],
        "cpu_us": cpu / n * 1e6,
        "claims": [(a - started, b - started, k) for a, b, k in claims],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the database files go")
    args = parser.parse_args()

    claims: list[tuple[float, float, int]] = []
    claim = LeaseKeeper.claim

    async def timed_claim(keeper: LeaseKeeper, agent_names: list[str], limit: int) -> Any:
        began = time.perf_counter()
        got = await claim(keeper, agent_names, limit)
        if got:
            claims.append((began, time.perf_counter(), len(got)))
        return got

    LeaseKeeper.claim = timed_claim  # type: ignore[assignment,method-assign]
    print(f"workload: {args.n} submitted invocations, one worker of concurrency {args.n}")
    lasts: list[float] = []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            url = f"sqlite:///{Path(tmp) / 'startup.db'}"
            trio.run(submit_all, url, args.n)
            claims.clear()
            figures = trio.run(start_worker, url, args.n, claims)
        lasts.append(figures["last"])
        spans = ", ".join(f"{a:.2f}-{b:.2f} s x{k}" for a, b, k in figures["claims"])
        print(
            f"worker {rep + 1}: last first model call {figures['last']:.2f} s after its start "
            f"(first {figures['first']:.2f}, p10 {figures['p10']:.2f}, median "
            f"{figures['median']:.2f}, p90 {figures['p90']:.2f}); "
            f"CPU per run {figures['cpu_us']:.0f} us; claims {spans}"
        )
    print(f"median of the last first model call: {statistics.median(lasts):.2f} s")


if __name__ == "__main__":
    main()
