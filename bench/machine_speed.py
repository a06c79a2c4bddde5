"""How fast this machine runs plain Python just now: a reference beside each figure.

The machines these benchmarks run on are shared, and their speed for the runtime's work
moves within an hour (docs/performance.md: the same build gave 2,463-2,531 turns/s at one
hour and 1,958-2,189 at the next). The load benchmarks (``concurrency.py``,
``worker_throughput.py``, ``read_models.py``) print this reference before they start:
the CPU time of a fixed pure-Python loop (5,000,000 multiply-adds), and of building and
dropping 300,000 small dicts (about 100 MB: memory and page faults as well), each the
least of three runs, and the load average. It tells a slow moment of the machine from a
fast one; it does not follow everything that moves these workloads, so a claim of one
build against another is still taken from runs of both in turn.

    python bench/machine_speed.py
"""

from __future__ import annotations

import os
import time

LOOP = 5_000_000
DICTS = 300_000


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


def reference_dicts_s(reps: int = 3) -> float:
    """CPU seconds of building and dropping the reference dicts: the least of ``reps`` runs."""
    best = float("inf")
    for _ in range(reps):
        started = time.process_time()
        made = [{"id": i, "name": str(i), "values": [i, i + 1]} for i in range(DICTS)]
        del made
        best = min(best, time.process_time() - started)
    return best


def describe() -> str:
    """One line: the two references' CPU times and the load average, now."""
    loop, dicts = reference_loop_s(), reference_dicts_s()
    return (
        f"machine now: reference loop {loop:.3f} s of CPU ({LOOP:,} multiply-adds), "
        f"{DICTS:,} dicts {dicts:.3f} s (least of 3 each), "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    print(describe())
