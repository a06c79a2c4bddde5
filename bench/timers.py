"""What a timed wait costs the trio thread with many tasks asleep at once.

N tasks are started at once in one nursery; each does one thing and ends:

- ``checkpoint``: ``trio.lowlevel.checkpoint()`` (the cost of a task alone);
- ``trio.sleep``: ``trio.sleep(S)``: a cancel scope with a deadline, woken by being
  cancelled (``Cancelled`` raised into the task and caught by the scope);
- ``timers.sleep``: ``loop_actors._timers.sleep(S)``, what ``ScriptedModel`` uses for
  its simulated latency: one heap of wake-up times, one deadline for all, each task
  woken by ``reschedule``.

CPU time (``time.process_time``) per task, median over REPS, the three kinds taken in
turn in each repetition; then what a sleep adds beyond the checkpoint, and the ratio of
the two sleeps' additions.

    python bench/timers.py [--n 20000] [--sleep 0.2] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable

import trio

from loop_actors._timers import sleep as timers_sleep


async def _timed(n: int, wait: Callable[[], Awaitable[None]]) -> float:
    started = time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(wait)
    return (time.process_time() - started) / n * 1e6


async def _measure(n: int, seconds: float, reps: int) -> dict[str, list[float]]:
    async def trio_sleep() -> None:
        await trio.sleep(seconds)

    async def our_sleep() -> None:
        await timers_sleep(seconds)

    kinds: dict[str, Callable[[], Awaitable[None]]] = {
        "checkpoint": trio.lowlevel.checkpoint,
        "trio.sleep": trio_sleep,
        "timers.sleep": our_sleep,
    }
    await _timed(100, kinds["timers.sleep"])  # the timers' task is started, untimed
    figures: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(reps):
        for kind, wait in kinds.items():
            figures[kind].append(await _timed(n, wait))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=20_000, help="tasks asleep at once")
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds each sleeps")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="unused (the tests pass it to every script)")
    args = parser.parse_args()
    figures = trio.run(_measure, args.n, args.sleep, args.reps)
    print(f"workload: {args.n} tasks at once, each sleeping {args.sleep:g} s; {args.reps} reps")
    medians = {kind: statistics.median(values) for kind, values in figures.items()}
    for kind, values in figures.items():
        print(
            f"{kind:13s}: median {medians[kind]:6.1f} us CPU per task "
            f"[{min(values):.1f}-{max(values):.1f}]"
        )
    trio_adds = medians["trio.sleep"] - medians["checkpoint"]
    timers_adds = medians["timers.sleep"] - medians["checkpoint"]
    print(
        f"a sleep adds beyond a checkpoint: trio.sleep {trio_adds:.1f} us, "
        f"timers {timers_adds:.1f} us"
    )
    print(f"ratio trio.sleep/timers (what a sleep adds): {trio_adds / max(timers_adds, 0.01):.2f}")


if __name__ == "__main__":
    main()
