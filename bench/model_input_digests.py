"""What the model-input digests cost a model call, against what the whole turn costs.

Each decision records the digests of its model request (``DecisionProposed.model_input``,
what ``loop-actors replay`` compares): the controller calls ``RequestDigests.of`` once per
model call, which digests each turn of the view the first time it is shown (its JSON) and
the goal, notices and view. Here that call is timed where it runs, inside the
turn_overhead workload (N invocations x 5 turns, 3 parallel reads in turns 1-4, one model
call a turn, on a fresh SQLite file each repetition): the time spent in it per model call,
and its share of the turn's time.

    python bench/model_input_digests.py [--n 200] [--reps 5] [--dir /tmp]
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

sys.path.insert(0, str(Path(__file__).parent))
from turn_overhead import T, ours

from loop_actors.agent.model import RequestDigests

SPENT: list[float] = []
"""Seconds each ``RequestDigests.of`` call took, in this process."""


def _timed(of: Any) -> Any:
    def timed(self: RequestDigests, **request: Any) -> Any:
        started = time.perf_counter()
        try:
            return of(self, **request)
        finally:
            SPENT.append(time.perf_counter() - started)

    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the database files go")
    args = parser.parse_args()

    RequestDigests.of = _timed(RequestDigests.of)  # type: ignore[method-assign]
    runs_s: list[float] = []
    digests_s: list[float] = []
    calls: list[int] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        trio.run(ours, Path(tmp) / "warmup.db", 2)
        for rep in range(args.reps):
            SPENT.clear()
            runs_s.append(trio.run(ours, Path(tmp) / f"run-{rep}.db", args.n))
            digests_s.append(sum(SPENT))
            calls.append(len(SPENT))
            every = sorted(SPENT)
    turns = args.n * T
    turn_us = statistics.median(runs_s) / turns * 1e6
    call_us = statistics.median(d / c for d, c in zip(digests_s, calls, strict=True)) * 1e6
    shares = [d / r for d, r in zip(digests_s, runs_s, strict=True)]
    print(f"workload: {args.n} invocations x {T} turns, {args.reps} repetitions")
    print(f"model calls digested per repetition: {calls[-1]:,} (one a turn)")
    print(f"turn (whole, digests included)     : {turn_us:8.1f} us (median)")
    print(f"digests of one model call          : {call_us:8.1f} us (median of the means)")
    print(
        f"  last repetition's calls          : median {every[len(every) // 2] * 1e6:.1f} us, "
        f"p90 {every[len(every) * 9 // 10] * 1e6:.1f} us, max {every[-1] * 1e6:.1f} us"
    )
    print(
        f"ratio digests/turn: median {statistics.median(shares):.3f} "
        f"({min(shares):.3f}-{max(shares):.3f})"
    )


if __name__ == "__main__":
    main()
