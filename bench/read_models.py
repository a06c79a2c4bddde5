"""How fast the read models catch up, and what the audit hash costs per event.

(Not ``bench/projections.py``: run as a script, that name would shadow the
``projections`` package, and mypy would see two modules of that name.)

Builds a store of N invocations of six kinds (completed after reads with one
failing, no progress, invalid decision, paused for a clarification, a committed
write, a write whose reply is lost and whose service is down), AT_ONCE of them
started at once in one ``async with Runtime(url)`` (the next AT_ONCE after those
end). Then, in one run:

- for each read model (trajectory, metrics, open_effects) on its own, and for
  the three in one runner (what the CLI and the runtime keep: each batch read
  and decoded once, applied to the three in one transaction): a full catch-up
  from position 0 into fresh read models, REPS times (a fresh views file each;
  on PostgreSQL, where the read models live in the store's database, the three
  only, by ``rebuild``);
- a further WAVE invocations, then the incremental catch-up of those read
  models (REPS of them per read model);
- reading and decoding every notification without any read model (the floor
  of a catch-up), and the ratio of the three's rate to it;
- what a rebuild of 1,000,000 events would take at the three's measured rate
  (an extrapolation from this store's size, which it names);
- over every event of the store: ``chain_hash_of(previous, event)`` (checking each
  aggregate's chain), the hash of each audit format on its own (format 2, what the
  aggregate computes for each new event: the body pydantic writes, then SHA-256; the
  store then writes that body as it is; format 1, the older one: the canonical record,
  the standard library's JSON encoder, SHA-256), the canonical record alone, and the
  mapper's encoding for storage (``model_dump_json`` as in
  ``loop_actors.store.mapper.PydanticEventMapper``), REPS times each.

Each rate is given per second of wall time and per second of the process's CPU
time (the second moves less when other work shares the machine).

With ``--rebuild-events E`` it measures one thing instead: the rebuild of a store of
at least E events. The runtime writes the N invocations as above; their stored
events are then copied, in their order, under new ids (each invocation id with a
suffix, each effect key derived again from the new id with
``aggregates.effect.effect_key``, each event's audit hash chained again with
``aggregates.audit.stored_link``) until the store holds E events: events a runtime
would have written for those invocations, written straight through the recorder
because running a million invocations would take the runtime far longer than the
rebuild. Then the three read models are rebuilt into a fresh views file (or the
``--views`` database) once: wall time, the process's CPU time, peak RSS.

    python bench/read_models.py [--n 2000] [--wave 200] [--reps 3] [--at-once 2000]
                                [--dir /tmp] [--db URL] [--views URL]
                                [--rebuild-events 1000000]

``--db`` is the event store (default: a new SQLite file in ``--dir``; a
``postgresql://`` URL of an empty database puts the store, and its read models,
there); ``--views`` puts the read models somewhere else (a SQLite file, or a
PostgreSQL database for a SQLite store).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import trio
from eventsourcing.persistence import StoredEvent
from machine_speed import describe as describe_machine

from aggregates.audit import (
    GENESIS,
    canonical_record,
    chain_hash_of,
    event_body,
    link,
    pack_body,
    split_stored,
    stored_link,
    stored_state,
    topic_of,
    unpack_state,
)
from aggregates.effect import effect_key
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
from loop_actors.store.mapper import _IN_COLUMNS
from loop_actors.store.read_models import open_runner, views_location
from loop_actors.store.store import EventStore
from projections import (
    MetricsProjection,
    OpenEffectsProjection,
    Projection,
    TrajectoryProjection,
    default_projections,
)
from projections.sql import is_postgres_url

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


async def populate(url: str, start: int, count: int, at_once: int | None = None) -> None:
    """Run ``count`` invocations from number ``start``, ``at_once`` of them at a time."""
    at_once = at_once or count
    async with Runtime(url) as runtime:
        for first in range(start, start + count, at_once):
            async with trio.open_nursery() as nursery:
                for i in range(first, min(first + at_once, start + count)):
                    nursery.start_soon(
                        partial(
                            runtime.run,
                            AGENTS[i % KINDS],
                            f"goal {i}",
                            invocation_id=f"inv-{i:06d}",
                            task_class=f"c{i % 3}",
                        )
                    )


def copy_invocations(store: EventStore, events: int) -> int:
    """Append copies of the store's invocations under new ids until it holds ``events``.

    Each copy is every stored event of the store as it was, in its order, with each
    invocation id ``inv-...`` given the suffix ``-cNNN``, each effect key derived again
    from the new invocation id, and each event's format-2 audit hash chained again
    over its new body. Returns the events in the store.
    """
    recorder, mapper = store.app.recorder, store.app.mapper
    assert mapper.cipher is None, "a plain store only"
    assert mapper.compressor is None, "a plain store only"
    template = recorder.select_notifications(start=0, limit=10**9)
    calls: dict[str, tuple[str, int, str]] = {}  # effect key -> (invocation, step, call)
    for notification in template:
        if notification.topic.endswith(":EffectPrepared"):
            found = split_stored(unpack_state(notification.state))
            assert found is not None
            prepared = json.loads(found[1])
            calls[str(notification.originator_id)] = (
                prepared["invocation_id"],
                prepared["step"],
                prepared["call_id"],
            )
    keys_of: dict[str, list[str]] = {}
    for key, (invocation_id, _, _) in calls.items():
        keys_of.setdefault(invocation_id, []).append(key)
    total, copy = len(template), 0
    while total < events:
        copy += 1
        suffix = f"-c{copy:03d}"
        renamed = {i: f"{i}{suffix}" for i in {c[0] for c in calls.values()}}
        renamed.update(
            (key, effect_key(f"{i}{suffix}", step, call)) for key, (i, step, call) in calls.items()
        )
        last: dict[str, str] = {}
        rows: list[StoredEvent] = []
        for notification in template[: events - total]:
            old_id = str(notification.originator_id)
            invocation_id = calls[old_id][0] if old_id in calls else old_id
            new_id = renamed.get(old_id) or f"{old_id}{suffix}"
            found = split_stored(unpack_state(notification.state))
            assert found is not None, "events of audit format 2 only"
            body = found[1]
            for old in (invocation_id, *keys_of.get(invocation_id, ())):
                body = body.replace(
                    f'"{old}"'.encode(), f'"{renamed.get(old) or old + suffix}"'.encode()
                )
            digest = stored_link(
                last.get(new_id, GENESIS), new_id, notification.originator_version,
                notification.topic, body,
            )  # fmt: skip
            last[new_id] = digest
            rows.append(
                StoredEvent(
                    originator_id=new_id,
                    originator_version=notification.originator_version,
                    topic=notification.topic,
                    # Stored as the runtime stores it: packed, but EffectPrepared's JSON.
                    state=(
                        stored_state(digest, body)
                        if notification.topic.endswith(":EffectPrepared")
                        else cast(bytes, pack_body(digest, body, deflate=True))
                    ),
                )
            )
        for start in range(0, len(rows), 5_000):
            recorder.insert_events(rows[start : start + 5_000])
        total += len(rows)
    return total


def rebuild_large(args: argparse.Namespace) -> None:
    """Build a store of ``--rebuild-events`` events and time one rebuild of the three."""
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        url = f"sqlite:///{Path(tmp) / 'events.db'}"
        started = time.perf_counter()
        trio.run(populate, url, 0, args.n, args.at_once)
        built_s = time.perf_counter() - started
        store = EventStore(url)
        written = store.head()
        started = time.perf_counter()
        head = copy_invocations(store, args.rebuild_events)
        copied_s = time.perf_counter() - started
        _check_chains(all_events(store, start=written, limit=2_000))  # the first copy's
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        views = args.views or str(Path(tmp) / "views.db")
        runner = open_runner(store, views, default_projections())
        try:
            events_applied, wall, cpu = timed(lambda: runner.rebuild()[0].events)
            shown = runner.query("SELECT COUNT(*) AS n FROM trajectory_invocations")[0]["n"]
        finally:
            runner.close()
        assert events_applied == head, (events_applied, head)
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        store.close()
    print(
        f"store: sqlite, {args.n} invocations of {KINDS} kinds written by the runtime "
        f"({written:,} events, {built_s:.1f} s), copied under new ids to {head:,} events "
        f"({head / written:.0f} x, {copied_s:.1f} s)"
    )
    print(f"read models: {'PostgreSQL' if is_postgres_url(views) else 'SQLite'}")
    print(
        f"rebuild of the three read models: {wall:.1f} s wall, {cpu:.1f} s CPU "
        f"({head / wall:,.0f} events/s, {head / cpu:,.0f} per CPU-second), "
        f"{shown:,} trajectories"
    )
    print(f"peak RSS: {rss_before:.0f} MB before the rebuild, {rss_after:.0f} MB after")


def _check_chains(events: Sequence[DomainEvent]) -> None:
    """Every event's format-2 hash follows its aggregate's previous one (copies included)."""
    last: dict[str, str] = {}
    for event in events:
        body = event_body(event)
        digest = stored_link(
            last.get(event.originator_id, GENESIS), event.originator_id,
            event.originator_version, topic_of(type(event)), body,
        )  # fmt: skip
        assert digest == event.chain_hash, event
        last[event.originator_id] = digest


def all_events(store: EventStore, start: int = 0, limit: int | None = None) -> list[DomainEvent]:
    """Every event in the store after position ``start`` (or ``limit`` of them), in order."""
    events: list[DomainEvent] = []
    position = start
    recorder, mapper = store.app.recorder, store.app.mapper
    while True:
        notifications = recorder.select_notifications(
            start=position, limit=500, inclusive_of_start=False
        )
        events.extend(cast("DomainEvent", mapper.to_domain_event(n)) for n in notifications)
        if len(notifications) < 500 or (limit is not None and len(events) >= limit):
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


Timing = tuple[int, float, float]
"""(events applied, wall seconds, CPU seconds of the process)."""


def timed(work: Callable[[], int]) -> Timing:
    """Run ``work`` (it returns how many events it handled) and time it."""
    wall, cpu = time.perf_counter(), time.process_time()
    events = work()
    return events, time.perf_counter() - wall, time.process_time() - cpu


def catch_up(store: EventStore, views: str, name: str, *, rebuild: bool = False) -> Timing:
    """Catch the read models ``name`` at ``views`` up with the store (or rebuild them)."""
    runner = open_runner(store, views, READ_MODELS[name]())
    try:
        action = runner.rebuild if rebuild else runner.catch_up
        return timed(lambda: action()[0].events)
    finally:
        runner.close()


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


def median_of(timings: list[Timing], index: int) -> float:
    return statistics.median(t[index] for t in timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--wave", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--at-once", type=int, default=2000, help="invocations started together")
    parser.add_argument("--dir", default=None, help="where the database files go")
    parser.add_argument("--db", default=None, help="the event store (default: a new SQLite file)")
    parser.add_argument("--views", default=None, help="where the read models go")
    parser.add_argument(
        "--rebuild-events",
        type=int,
        default=0,
        help="only time one rebuild of a store of this many events (copies of --n invocations)",
    )
    args = parser.parse_args()
    print(describe_machine())
    if args.rebuild_events:
        rebuild_large(args)
        return

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'events.db'}"
        started = time.perf_counter()
        trio.run(populate, url, 0, args.n, args.at_once)
        built_s = time.perf_counter() - started
        store = EventStore(url)
        head = store.head()
        # One database for every read model (PostgreSQL): the three only, rebuilt each time.
        shared = is_postgres_url(args.views or "") or (
            args.views is None and store.url.kind == "postgresql"
        )
        names = ["all three"] if shared else list(READ_MODELS)

        def views_of(name: str, rep: int) -> str:
            if shared:
                return views_location(store, args.views)
            return str(Path(tmp) / f"views-{name.replace(' ', '_')}-{rep}.db")

        full: dict[str, list[Timing]] = {name: [] for name in names}
        for rep in range(args.reps):
            for name in names:
                full[name].append(catch_up(store, views_of(name, rep), name, rebuild=shared))
                assert full[name][-1][0] == head, full[name][-1]
        decode = [timed(lambda: read_and_decode(store)) for _ in range(args.reps)]
        assert decode[0][0] == head

        trio.run(populate, url, args.n, args.wave, args.at_once)
        wave_events = store.head() - head
        incremental: dict[str, list[Timing]] = {name: [] for name in names}
        for rep in range(args.reps):
            for name in names:
                if shared and rep:  # the one set of read models is caught up: another wave
                    trio.run(populate, url, args.n + rep * args.wave, args.wave, args.at_once)
                incremental[name].append(catch_up(store, views_of(name, rep), name))
                assert incremental[name][-1][0] > 0

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
        decoding = median_of(decode, 1) / head * 1e6
        where = "PostgreSQL" if shared else "SQLite"
        store.close()

    print(
        f"store: {store.url.kind}, {args.n} invocations of {KINDS} kinds ({args.at_once} at "
        f"once), {head:,} events ({head / args.n:.1f} per invocation), built in {built_s:.1f} s"
    )
    print(f"read models: {where}")
    print(f"wave: {args.wave} more invocations, {wave_events:,} events")
    print(f"repetitions: {args.reps} (median; fresh read models for each full catch-up)")
    print()
    print(
        f"{'read model':<26} {'full events/s':>14} {'per CPU-s':>10} {'full s':>7} "
        f"{'wave events/s':>14} {'per CPU-s':>10}"
    )
    for name in names:
        full_s, full_cpu = median_of(full[name], 1), median_of(full[name], 2)
        wave = incremental[name]
        wave_rate = statistics.median(t[0] / t[1] for t in wave)
        wave_cpu_rate = statistics.median(t[0] / t[2] for t in wave)
        print(
            f"{name:<26} {rate(head, full_s):>14} {rate(head, full_cpu):>10} {full_s:7.2f} "
            f"{wave_rate:>14,.0f} {wave_cpu_rate:>10,.0f}"
        )
    read_s, read_cpu = median_of(decode, 1), median_of(decode, 2)
    print(
        f"{'read + decode, no model':<26} {rate(head, read_s):>14} {rate(head, read_cpu):>10} "
        f"{read_s:7.2f}"
    )
    three_s, three_cpu = median_of(full["all three"], 1), median_of(full["all three"], 2)
    print()
    print(
        f"all three together: {head / three_s:,.0f} events/s, {read_s / three_s:.2f} x the rate "
        f"of decoding alone ({head / three_cpu:,.0f} per CPU-second, "
        f"{read_cpu / three_cpu:.2f} x)"
    )
    print(
        f"a rebuild of 1,000,000 events at that rate: {1e6 * three_s / head:,.0f} s "
        f"(extrapolated from this store's {head:,} events)"
    )
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
