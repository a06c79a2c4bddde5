"""Paired statistics for ``loop-actors eval compare``: a seeded bootstrap of mean deltas.

McNemar's exact test (in ``_eval``) says whether pass/fail flips lean one way;
for costs and latencies, which are numbers, :func:`paired_bootstrap` gives a
confidence interval of the mean change over the paired cases. The resampling
uses its own seeded generator, so the same two reports give the same interval
on every machine and every run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from aggregates.decisions import Frozen

BOOTSTRAP_SEED = 16
"""The generator's seed: a comparison is reproducible, bit for bit."""

BOOTSTRAP_RESAMPLES = 2000
"""Resamples per measure: the 2.5th and 97.5th percentiles of 2000 means are stable
to well under a tenth of the interval's width for the sizes an eval has."""


class BootstrapInterval(Frozen):
    """The mean paired delta (B minus A) and its 95% percentile bootstrap interval."""

    pairs: int
    mean_delta: float
    low: float
    high: float


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    position = fraction * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def paired_bootstrap(
    deltas: Sequence[float],
    *,
    seed: int = BOOTSTRAP_SEED,
    resamples: int = BOOTSTRAP_RESAMPLES,
    digits: int = 6,
) -> BootstrapInterval | None:
    """The mean of ``deltas`` and a 95% interval from resampling the pairs with replacement.

    Each delta is one pair's B minus A, so resampling deltas keeps the pairing. None
    for no pair. Deterministic: the generator is ``random.Random(seed)``.
    """
    if not deltas:
        return None
    count = len(deltas)
    mean = sum(deltas) / count
    if all(delta == deltas[0] for delta in deltas):  # every resample has this mean
        same = round(mean, digits)
        return BootstrapInterval(pairs=count, mean_delta=same, low=same, high=same)
    # Not for security: a reproducible resampling.
    generator = random.Random(seed)  # noqa: S311
    means = sorted(sum(generator.choices(deltas, k=count)) / count for _ in range(resamples))
    return BootstrapInterval(
        pairs=count,
        mean_delta=round(mean, digits),
        low=round(_percentile(means, 0.025), digits),
        high=round(_percentile(means, 0.975), digits),
    )
