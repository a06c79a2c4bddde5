"""How fast the read models catch up, and what the audit hash costs per event.

(Not ``bench/projections.py``: run as a script, that name would shadow the
``projections`` package, and mypy would see two modules of that name.)

Builds a SQLite store of N invocations of six kinds (completed after reads with
one failing, no progress, invalid decision, paused for a clarification, a
committed write, a write whose reply is lost and whose service is down), all
started at once in one ``async with Runtime(url)``. Then, in one run:

- for each read model (trajectory, metrics, open_effects) on its own, and for
  the three in one runner: a full catch-up from position 0 into a fresh views
  file, REPS times (one fresh file each);
- a further WAVE invocations, then the incremental catch-up of each of those
  views files (REPS of them per read model);
- reading and decoding every notification without any read model (the floor
  of a catch-up);
- over every event of the store: ``chain_hash_of(previous, event)`` (checking each
  aggregate's chain), the hash of each audit format on its own (format 2, what the
  aggregate computes for each new event: the body pydantic writes, then SHA-256; the
  store then writes that body as it is; format 1, the older one: the canonical record,
  the standard library's JSON encoder, SHA-256), the canonical record alone, and the
  mapper's encoding for storage (``model_dump_json`` as in
  ``loop_actors._store.PydanticEventMapper``), REPS times each.

    python bench/read_models.py [--n 2000] [--wave 200] [--reps 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import trio

from aggregates.audit import (
    GENESIS,
    canonical_record,
    chain_hash_of,
    event_body,
    link,
    stored_link,
    topic_of,
)
from aggregates.events import DomainEvent
from loop_actors import (
    Agent,
    Budget,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    ToolContext,
    ToolError,
    tool,
)
from loop_actors._store import _IN_COLUMNS, EventStore
from loop_actors._views import open_runner
from projections import (
    MetricsProjection,
    OpenEffectsProjection,
    Projection,
    TrajectoryProjection,
    default_projections,
)

KINDS = 6
READ_MODELS: dict[str, Callable[[], list[Projection]]] = {
    "trajectory": lambda: [TrajectoryProjection()],
    "metrics": lambda: [MetricsProjection()],
    "open_effects": lambda: [OpenEffectsProjection()],
    "all three": default_projections,
}


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look up a key; ``missing`` is not there."""
    if key == "missing":
        raise ToolError("no such key")
    return {"key": key}


def reconcile_pay(key: str) -> Reconciled:
    raise ConnectionError("payment service down")


@tool(effect="write", reconcile=reconcile_pay)
async def pay(amount: int, context: ToolContext) -> str:
    """Pay; the reply of an amount over 100 is lost."""
    if amount > 100:
        raise TimeoutError("reply lost")
    return f"paid {amount}"


def behaviour(kind: int) -> Callable[[ModelRequest], dict[str, Any]]:
    """One of six kinds of invocation, so that every read model sees every outcome."""

    def calls(*items: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
        return {
            "kind": "tool_calls",
            "calls": [{"id": i, "name": name, "arguments": args} for i, name, args in items],
        }

    def decide(request: ModelRequest) -> dict[str, Any]:
        first = request.step == 1
        match kind:
            case 0:  # two reads, one failing, then an answer
                if first:
                    return calls(("a", "lookup", {"key": "x"}), ("b", "lookup", {"key": "missing"}))
                return {"kind": "final", "answer": "done"}
            case 1:  # the same read again: no progress
                return calls(("a", "lookup", {"key": "same"}))
            case 2:  # an empty batch: invalid decision
                return {"kind": "tool_calls", "calls": []}
            case 3:  # paused for a clarification
                return {"kind": "clarification", "question": "which one?"}
            case 4:  # a committed write, then an answer
                if first:
                    return calls(("p", "pay", {"amount": 5}))
                return {"kind": "final", "answer": "paid"}
            case _:  # a lost reply and a service down: paused, effect left open
                return calls(("p", "pay", {"amount": 500}))

    return decide


AGENTS = [
    Agent(f"agent-{kind % 2}", ScriptedModel(behaviour(kind)), [lookup, pay], Budget(max_steps=4))
    for kind in range(KINDS)
]


async def populate(url: str, start: int, count: int) -> None:
    async with Runtime(url) as runtime, trio.open_nursery() as nursery:
        for i in range(start, start + count):
            nursery.start_soon(
                partial(
                    runtime.run,
                    AGENTS[i % KINDS],
                    f"goal {i}",
                    invocation_id=f"inv-{i:06d}",
                    task_class=f"c{i % 3}",
                )
            )


def all_events(store: EventStore) -> list[DomainEvent]:
    """Every event in the store, in notification order."""
    events: list[DomainEvent] = []
    position = 0
    recorder, mapper = store.app.recorder, store.app.mapper
    while True:
        notifications = recorder.select_notifications(
            start=position, limit=500, inclusive_of_start=False
        )
        events.extend(cast("DomainEvent", mapper.to_domain_event(n)) for n in notifications)
        if len(notifications) < 500:
            return events
        position = notifications[-1].id


def read_and_decode(store: EventStore) -> int:
    """Read and decode every notification, keeping none: what a catch-up does before applying."""
    count = 0
    position = 0
    recorder, mapper = store.app.recorder, store.app.mapper
    while True:
        notifications = recorder.select_notifications(
            start=position, limit=500, inclusive_of_start=False
        )
        for notification in notifications:
            mapper.to_domain_event(notification)
        count += len(notifications)
        if len(notifications) < 500:
            return count
        position = notifications[-1].id


def catch_up(store: EventStore, views: Path, name: str) -> tuple[int, float]:
    """Catch one views file up with the store: (events applied, seconds)."""
    runner = open_runner(store, str(views), READ_MODELS[name]())
    try:
        started = time.perf_counter()
        reports = runner.catch_up()
        elapsed = time.perf_counter() - started
    finally:
        runner.close()
    return reports[0].events, elapsed


def per_event(
    events: Sequence[DomainEvent], reps: int, make_work: Callable[[], Callable[[DomainEvent], Any]]
) -> float:
    """Median over reps of the µs per event that ``make_work()`` takes (fresh each rep)."""
    times = []
    for _ in range(reps):
        work = make_work()
        started = time.perf_counter()
        for event in events:
            work(event)
        times.append((time.perf_counter() - started) / len(events) * 1e6)
    return statistics.median(times)


def hash_chain() -> Callable[[DomainEvent], None]:
    """A per-event step that recomputes each aggregate's chain, checking every hash."""
    last: dict[str, str] = {}

    def step(event: DomainEvent) -> None:
        previous = last.get(event.originator_id, GENESIS)
        digest = chain_hash_of(previous, event)
        assert digest == event.chain_hash, event
        last[event.originator_id] = digest

    return step


def rate(events: int, seconds: float) -> str:
    return f"{events / seconds:>10,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--wave", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the database files go")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        url = f"sqlite:///{Path(tmp) / 'events.db'}"
        started = time.perf_counter()
        trio.run(populate, url, 0, args.n)
        built_s = time.perf_counter() - started
        store = EventStore(url)
        head = store.head()

        full: dict[str, list[tuple[int, float]]] = {name: [] for name in READ_MODELS}
        for rep in range(args.reps):
            for name in READ_MODELS:
                views = Path(tmp) / f"views-{name.replace(' ', '_')}-{rep}.db"
                full[name].append(catch_up(store, views, name))
        decode_s = []
        for _ in range(args.reps):
            started = time.perf_counter()
            decoded = read_and_decode(store)
            decode_s.append(time.perf_counter() - started)
        assert decoded == head

        trio.run(populate, url, args.n, args.wave)
        wave_events = store.head() - head
        incremental: dict[str, list[tuple[int, float]]] = {name: [] for name in READ_MODELS}
        for rep in range(args.reps):
            for name in READ_MODELS:
                views = Path(tmp) / f"views-{name.replace(' ', '_')}-{rep}.db"
                incremental[name].append(catch_up(store, views, name))
                assert incremental[name][-1][0] == wave_events

        events = all_events(store)
        hashing = per_event(events, args.reps, hash_chain)
        canonical = per_event(events, args.reps, lambda: canonical_record)
        format_1 = per_event(
            events, args.reps, lambda: lambda e: link(GENESIS, canonical_record(e))
        )
        format_2 = per_event(
            events,
            args.reps,
            lambda: (
                lambda e: stored_link(
                    GENESIS, e.originator_id, e.originator_version, topic_of(type(e)), event_body(e)
                )
            ),
        )
        encoding = per_event(
            events,
            args.reps,
            lambda: lambda e: e.model_dump_json(exclude=_IN_COLUMNS, exclude_none=True).encode(),
        )
        decoding = statistics.median(decode_s) / head * 1e6
        store.close()

    print(
        f"store: {args.n} invocations of {KINDS} kinds, {head:,} events "
        f"({head / args.n:.1f} per invocation), built in {built_s:.1f} s"
    )
    print(f"wave: {args.wave} more invocations, {wave_events:,} events")
    print(f"repetitions: {args.reps} (median; a fresh views file for each full catch-up)")
    print()
    print(f"{'read model':<26} {'full events/s':>14} {'full s':>8} {'wave events/s':>14}")
    for name in READ_MODELS:
        full_s = statistics.median(s for _, s in full[name])
        wave_s = statistics.median(s for _, s in incremental[name])
        print(f"{name:<26} {rate(head, full_s):>14} {full_s:8.2f} {rate(wave_events, wave_s):>14}")
    read_s = statistics.median(decode_s)
    print(f"{'read + decode, no model':<26} {rate(head, read_s):>14} {read_s:8.2f} {'':>14}")
    print()
    print(f"per event, over all {len(events):,} events (median of {args.reps}):")
    for label, value, unit in [
        ("chain_hash_of, checking every chain", hashing, "us"),
        ("hash, format 2 (body as stored, SHA-256)", format_2, "us"),
        ("hash, format 1 (canonical record, JSON, SHA-256)", format_1, "us"),
        ("  of which the canonical record (two model_dump)", canonical, "us"),
        ("encode for storage (model_dump_json)", encoding, "us"),
        ("read + decode from the store (to_domain_event)", decoding, "us"),
        ("format 2 / encode", format_2 / encoding, "x"),
        ("format 1 / encode", format_1 / encoding, "x"),
    ]:
        print(f"  {label:<50}: {value:6.1f} {unit}")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
