"""The long run of the edge fuzzer (tests/runtime/test_fuzz_edges.py runs 50 examples in CI).

Draws EXAMPLES runs of a model, tools, a service and a policy that answer NaN, ±Infinity,
lone surrogates, deep nesting, huge strings, negative numbers, non-JSON objects,
BaseExceptions and models built with ``model_construct`` (decisions, replies without a
proposal, usages, ``Reconciled``, ``Deny``; the test module's docstring lists them),
each a full run on one SQLite file; every run must end typed and read back, and
afterwards the CLI's ``history`` and ``show`` (of a sample of SAMPLE invocations),
``list``, ``metrics``, ``effects`` and ``audit verify`` must succeed on the database
without a traceback.

    PYTHONPATH=. python bench/fuzz_edges.py [--examples 2000] [--sample 50] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

from aggregates.invocation import DecisionProposed, Paused, ResultsCommitted, Terminated
from loop_actors.store.store import EventStore
from tests.runtime.test_fuzz_edges import check_cli, fuzz


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--sample", type=int, default=50, help="invocations shown by the CLI")
    parser.add_argument("--dir", default=None, help="where the database goes (default: a temp dir)")
    args = parser.parse_args()
    where = Path(args.dir or tempfile.mkdtemp(prefix="fuzz-edges-"))
    db_url = f"sqlite:///{where / 'fuzz.db'}"
    started = time.perf_counter()
    ids = fuzz(db_url, args.examples)
    ran = time.perf_counter() - started
    check_cli(db_url, ids, where, sample=args.sample)
    reasons: collections.Counter[str] = collections.Counter()
    rejections: collections.Counter[str] = collections.Counter()
    results: collections.Counter[str] = collections.Counter()
    # What user code handed in built with model_construct, as the runs recorded it.
    malformed: collections.Counter[str] = collections.Counter()
    store = EventStore(db_url, create=False)
    try:
        for invocation_id in ids:
            for event in store.events(invocation_id):
                if isinstance(event, Terminated | Paused):
                    reasons[event.reason.value] += 1
                    if isinstance(event, Terminated) and "not a Usage" in (event.detail or ""):
                        malformed["usage"] += 1
                elif isinstance(event, DecisionProposed) and event.rejection is not None:
                    rejections[event.rejection.rejection_class.value] += 1
                elif isinstance(event, ResultsCommitted):
                    for result in event.results:
                        results[result.error.error_class.value if result.error else "ok"] += 1
                        for kind in ("Deny", "ToolError"):
                            if result.error and f"malformed {kind}" in result.error.message:
                                malformed[kind] += 1
    finally:
        store.close()
    print(f"{len(ids)} runs in {ran:.1f} s on {db_url}; the CLI read the database after them")
    print("outcomes:", dict(reasons.most_common()))
    print("rejections:", dict(rejections.most_common()))
    print("results:", dict(results.most_common()))
    print("constructed values caught (usage, Deny, ToolError):", dict(malformed.most_common()))


if __name__ == "__main__":
    main()
