"""How fast this machine runs plain Python just now: a reference beside each figure.

The machines these benchmarks run on are shared, and their speed for the runtime's work
moves within an hour (docs/performance.md: the same build gave 2,463-2,531 turns/s at one
hour and 1,958-2,189 at the next). The load benchmarks (``concurrency.py``,
``worker_throughput.py``, ``read_models.py``) print this reference before they start:
the CPU time of a fixed pure-Python loop (5,000,000 multiply-adds, the least of three
runs) and the load average. Two runs' figures compare when their references are close;
a claim of one build against another is still taken from runs of both in turn.

    python bench/machine_speed.py
"""

from __future__ import annotations

import os
import time

LOOP = 5_000_000


def reference_loop_s(reps: int = 3) -> float:
    """CPU seconds of the reference loop: the least of ``reps`` runs."""
    best = float("inf")
    for _ in range(reps):
        started = time.process_time()
        total = 0
        for i in range(LOOP):
            total += i * i
        best = min(best, time.process_time() - started)
    return best


def describe() -> str:
    """One line: the reference loop's CPU time and the load average, now."""
    seconds = reference_loop_s()
    return (
        f"machine now: reference loop {seconds:.3f} s of CPU "
        f"({LOOP:,} multiply-adds, least of 3), load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    print(describe())
