"""The options of ``worker`` and ``workers``.

The literals below are the runtime's values (a test checks that they agree): written
here so that these options import nothing heavy.
"""

from __future__ import annotations

import argparse
import math

from loop_actors.cli.parser import AddArguments, checkpoint_options, db_option, positive_int

QUEUE_STATUSES = ["runnable", "claimed", "paused", "ended"]
"""The values of ``aggregates.lease.QueueStatus``, in its order (``list --status``)."""

DEFAULT_CONCURRENCY = 8
"""``Worker``'s default ``concurrency``."""
DEFAULT_LEASE_S = 30.0
"""``aggregates.lease.DEFAULT_LEASE_S``."""
DEFAULT_GRACE_S = 30.0
"""``Worker``'s default ``grace_s``."""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text!r}")
    return value


def _add_worker(worker: argparse.ArgumentParser) -> None:
    worker.add_argument(
        "--agent",
        dest="agents",
        action="append",
        required=True,
        metavar="MODULE:ATTR",
        help="an agent this worker serves (repeat for more)",
    )
    worker.add_argument(
        "--concurrency",
        type=positive_int,
        default=DEFAULT_CONCURRENCY,
        help=f"invocations driven at once (default {DEFAULT_CONCURRENCY})",
    )
    worker.add_argument(
        "--lease-s",
        type=_seconds,
        default=DEFAULT_LEASE_S,
        help=f"how long a lease lasts without a heartbeat (default {DEFAULT_LEASE_S:g})",
    )
    worker.add_argument(
        "--grace-s",
        type=_seconds,
        default=DEFAULT_GRACE_S,
        help="on SIGTERM/SIGINT, how long runs may take to reach their next commit "
        f"(default {DEFAULT_GRACE_S:g})",
    )
    worker.add_argument(
        "--rate-limit",
        dest="rate_limits",
        action="append",
        metavar="PROVIDER:MODEL:RPM:TPM",
        help="a provider's limit for a model, shared with every run and worker of the store "
        "(requests and tokens a minute; '-' for none); repeat for more",
    )
    worker.add_argument(
        "--config",
        metavar="FILE",
        help="a TOML file of [[rate_limit]] tables (provider, model, requests_per_minute, "
        "tokens_per_minute, window_s, max_wait_s), with those of --rate-limit",
    )
    worker.add_argument("--json", action="store_true", help="print the final report as JSON")
    db_option(worker, shared=True)
    checkpoint_options(worker)


def _add_workers(workers: argparse.ArgumentParser) -> None:
    workers.add_argument("--json", action="store_true", help="one JSON object a line")
    db_option(workers, shared=True)


ARGUMENTS: dict[str, AddArguments] = {
    "worker": _add_worker,
    "workers": _add_workers,
}
