"""The CPU of a turn's events in the pure core: built, sealed and applied; encoded; decoded.

The events of bench/turn_overhead.py's workload (5 turns: turns 1-4 propose K=3 reads,
dispatch them and commit their results; turn 5 answers and the invocation ends), made
by the ``Invocation`` aggregate itself, without trio, a store or a clock:

- built, sealed and applied: ``Invocation.start`` / ``propose`` / ``dispatch`` /
  ``commit_results`` / ``terminate`` (each builds its event, hashes it over its body
  and folds it in), with the values a model and a tool would hand the core (a
  validated decision, its dispatched calls, validated results) made inside the loop;
- encoded: the store's mapper turning each new event into its row (its kept body,
  packed), as the Journal thread does;
- decoded: the mapper turning each row back into its event, as a load does.

CPU time (``time.process_time``) per turn, median over REPS, with the garbage collector
off while timed (the runtime's GC policy is measured by bench/concurrency.py). Then
counts that do not depend on the load, from one untimed pass under ``sys.setprofile``:
per turn, the pydantic validations (``validate_python`` / ``validate_json``, nested
models validated inside one call count once), ``to_json`` calls (bodies, and the id of
a decoded row), SHA-256 hashes, and calls of pydantic's private-attribute set-up
(``init_private_attributes``).

    python bench/turn_core_events.py [--n 300] [--reps 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from turn_overhead import K, T

from aggregates.decisions import (
    Budget,
    Final,
    TerminalReason,
    ToolCall,
    ToolCalls,
    ToolEffect,
    ToolResult,
    Usage,
)
from aggregates.invocation import DispatchedCall, Invocation, InvocationEvent, ToolSpec
from loop_actors.store.store import EventStore

AT = datetime(2026, 1, 1, tzinfo=UTC)
TOOLS = [ToolSpec(name="lookup", effect=ToolEffect.READ, schema_digest="0" * 64)]


def one_invocation(i: int) -> list[InvocationEvent]:
    """The events of one invocation of the workload, as the core makes them."""
    inv = Invocation.start(
        invocation_id=f"inv-{i:06d}",
        goal=f"g-{i:05d}",
        agent_name="bench",
        agent_version="1",
        catalogue_digest="0" * 64,
        tools=TOOLS,
        budget=Budget(),
        at=AT,
    )
    for turn in range(1, T):
        calls = [
            ToolCall(id=f"call_{i}_t{turn}_{j}", name="lookup", arguments={"key": f"t{turn}/k{j}"})
            for j in range(K)
        ]
        inv.propose(ToolCalls(calls=calls), usage=Usage(input_tokens=100, output_tokens=20), at=AT)
        dispatched = [
            DispatchedCall(
                call_id=c.id, name=c.name, arguments=dict(c.arguments), effect=ToolEffect.READ
            )
            for c in calls
        ]
        inv.dispatch(dispatched, [[c.id for c in calls]], at=AT)
        results = [
            ToolResult(call_id=c.id, name=c.name, output={"key": c.arguments["key"], "ok": True})
            for c in calls
        ]
        inv.commit_results(results, at=AT)
    inv.propose(Final(answer=f"g-{i:05d}: done"), usage=Usage(input_tokens=100), at=AT)
    inv.terminate(TerminalReason.COMPLETED, answer=f"g-{i:05d}: done", at=AT)
    return inv.take_events()


COUNTED = {
    "validate_python": "pydantic validations",
    "validate_json": "pydantic validations",
    "to_json": "to_json calls (a body; an id when decoded)",
    "openssl_sha256": "SHA-256 hashes",
    "init_private_attributes": "private-attribute set-ups",
}


def counts_per_turn(mapper: Any, n: int) -> dict[str, float]:
    """What one pass of ``n`` invocations calls, per turn, made, encoded and decoded."""
    counted: Counter[tuple[str, str]] = Counter()
    stage = ["built"]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            name = getattr(arg, "__name__", "")
        elif event == "call":
            name = frame.f_code.co_name
        else:
            return
        if name in COUNTED:
            counted[stage[0], COUNTED[name]] += 1

    sys.setprofile(profile)
    try:
        events = [event for i in range(n) for event in one_invocation(i)]
        stage[0] = "encoded"
        stored = [mapper.to_stored_event(event) for event in events]
        stage[0] = "decoded"
        for row in stored:
            mapper.to_domain_event(row)
    finally:
        sys.setprofile(None)
    return {
        f"{what}, {where}": counted[where, what] / (n * T)
        for where in ("built", "encoded", "decoded")
        for what in dict.fromkeys(COUNTED.values())
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="invocations per repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="unused (no files are written)")
    args = parser.parse_args()
    store = EventStore("memory://")
    mapper: Any = store.app.mapper
    for i in range(20):  # warm-up
        for event in one_invocation(i):
            mapper.to_domain_event(mapper.to_stored_event(event))
    rows: dict[str, list[float]] = {}
    turns = args.n * T
    events_per_turn = 0.0
    gc.disable()
    try:
        for _ in range(args.reps):
            started = time.process_time()
            made = [one_invocation(i) for i in range(args.n)]
            built = time.process_time() - started
            events = [event for history in made for event in history]
            started = time.process_time()
            stored = [mapper.to_stored_event(event) for event in events]
            encoded = time.process_time() - started
            started = time.process_time()
            for row in stored:
                mapper.to_domain_event(row)
            decoded = time.process_time() - started
            events_per_turn = len(events) / turns
            for name, seconds in (
                ("built, sealed and applied", built),
                ("encoded by the store's mapper", encoded),
                ("decoded by the store's mapper", decoded),
            ):
                rows.setdefault(name, []).append(seconds / turns * 1e6)
            del made, events, stored
            gc.collect()
    finally:
        gc.enable()
        store.close()
    print(
        f"workload: {args.n} invocations x {T} turns ({K} reads in turns 1-{T - 1}), "
        f"{events_per_turn:.1f} events per turn; {args.reps} repetitions, GC off while timed"
    )
    for name, values in rows.items():
        print(
            f"{name:30s}: median {statistics.median(values):7.1f} us CPU per turn "
            f"[{min(values):.1f}-{max(values):.1f}]"
        )
    total = sum(statistics.median(values) for values in rows.values())
    print(f"{'all three':30s}: median {total:7.1f} us CPU per turn")
    store = EventStore("memory://")
    try:
        counts = counts_per_turn(store.app.mapper, 5)
    finally:
        store.close()
    for name in sorted(counts):
        print(f"per turn: {name:52s} {counts[name]:5.1f}")


if __name__ == "__main__":
    main()
