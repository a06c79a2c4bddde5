"""`audit verify` checks that each history is a sequence its aggregate accepts.

The hash chain proves that the rows are the ones whose hashes were computed; someone
who can compute a hash can append a well-chained event that the aggregate's transitions
refuse, and such a history passed every mode of the audit while ``resume`` failed on it.
Now every whole chain is replayed through its aggregate (the transition tables of an
invocation and of the effect ledger, then each event's own checks), and the first event
it refuses is reported as a break at its position, exit 4.

Bad inputs tried, each appended with its hash recomputed as the store computes it: a
copy of an invocation's ``Terminated`` after it (audit format 2); a ``DecisionProposed``
of the next step after ``Terminated`` (format 1, the canonical hash); a second
``EffectCommitted`` after an effect's ``EffectCommitted``. Each is checked by the whole
store's audit (text and ``--json``), by ``audit verify ID``, and against a checkpoint
taken after the forgery (which the log alone satisfies).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.audit import (
    PACKED_DEFLATE,
    chain_hash_of,
    event_body,
    pack_state,
    stored_link,
    stored_state,
    topic_of,
)
from aggregates.audit_coverage import INVOCATION, transition_problem
from aggregates.decisions import Final, Usage
from aggregates.events import DomainEvent
from aggregates.invocation import DecisionProposed
from loop_actors import Runtime
from loop_actors.store.store import EventStore
from tests.support.audit import AGENT
from tests.support.cli import run_cli

_stores: dict[str, Path] = {}


@pytest.fixture
def db(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of a store with two completed refunds, inv-a and inv-b (built once)."""
    if "store" not in _stores:
        path = tmp_path_factory.mktemp("sequences") / "audit.db"

        async def go() -> None:
            with trio.fail_after(60):
                async with Runtime(f"sqlite:///{path}") as runtime:
                    await runtime.run(AGENT, "refund", invocation_id="inv-a")
                    await runtime.run(AGENT, "refund", invocation_id="inv-b")

        trio.run(go)
        _stores["store"] = path
    copy = tmp_path / "audit.db"
    shutil.copyfile(_stores["store"], copy)
    return copy


def stored(db: Path, aggregate_id: str) -> list[Any]:
    events = EventStore(f"sqlite:///{db}", read_only=True)
    try:
        return [event for _, event in events.stored_entries(aggregate_id)]
    finally:
        events.close()


def append(db: Path, event: DomainEvent, previous_hash: str, *, audit_format: int) -> None:
    """Append ``event`` to its aggregate's rows, its hash recomputed in ``audit_format``."""
    topic = topic_of(type(event))
    if audit_format == 2:
        event = event.model_copy(update={"audit_format": 2, "chain_hash": ""})
        body = event_body(event)
        digest = stored_link(
            previous_hash, event.originator_id, event.originator_version, topic, body
        )
        state = pack_state(stored_state(digest, body), deflate=True)
        assert state[0] == PACKED_DEFLATE
    else:
        event = event.model_copy(update={"audit_format": None, "chain_hash": ""})
        event = event.model_copy(update={"chain_hash": chain_hash_of(previous_hash, event)})
        state = event.model_dump_json(
            exclude={"originator_id", "originator_version"}, exclude_none=True
        ).encode()
    connection = sqlite3.connect(db)
    with connection:
        connection.execute(
            "INSERT INTO stored_events (originator_id, originator_version, topic, state) "
            "VALUES (?, ?, ?, ?)",
            (event.originator_id, event.originator_version, topic, state),
        )
    connection.close()


def forge_terminated_twice(db: Path) -> tuple[str, int]:
    events = stored(db, "inv-a")
    last = events[-1]
    again = last.model_copy(update={"originator_version": last.originator_version + 1})
    append(db, again, last.chain_hash, audit_format=2)
    return "inv-a", again.originator_version


def forge_decision_after_the_end(db: Path) -> tuple[str, int]:
    events = stored(db, "inv-a")
    last = events[-1]
    decision = DecisionProposed(
        originator_id="inv-a",
        originator_version=last.originator_version + 1,
        timestamp=datetime(2026, 12, 1, 12, tzinfo=UTC),
        step=4,
        decision=Final(answer="refunded 400 after all"),
        usage=Usage(),
    )
    append(db, decision, last.chain_hash, audit_format=1)
    return "inv-a", decision.originator_version


def forge_second_commit_of_a_write(db: Path) -> tuple[str, int]:
    (key,) = [
        call.effect_key
        for event in stored(db, "inv-a")
        for call in getattr(event, "calls", [])
        if call.effect_key
    ]
    events = stored(db, key)
    last = events[-1]
    again = last.model_copy(update={"originator_version": last.originator_version + 1})
    append(db, again, last.chain_hash, audit_format=2)
    return key, again.originator_version


FORGERIES = {
    "Terminated after Terminated": forge_terminated_twice,
    "DecisionProposed after Terminated": forge_decision_after_the_end,
    "EffectCommitted after EffectCommitted": forge_second_commit_of_a_write,
}


def cli(db: Path, *args: str) -> Any:
    return run_cli(*args, "--no-state", cwd=db.parent, db="sqlite:///audit.db", timeout=60)


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_an_event_its_aggregate_refuses_is_a_break_at_its_position(db: Path, forgery: str) -> None:
    aggregate_id, position = FORGERIES[forgery](db)
    whole = cli(db, "audit", "verify", "--json")
    assert whole.returncode == 4, whole.stdout
    broken = [json.loads(line) for line in whole.stdout.splitlines()]
    broken = [r for r in broken if "id" in r and not r["intact"]]
    assert [(r["id"], r["broken_at"], r["events"]) for r in broken] == [
        (aggregate_id, position, position - 1)
    ]
    assert "transitions refuse it" in broken[0]["problem"]
    assert (
        "not accepted in this phase" in broken[0]["problem"]
        or "in status" in (broken[0]["problem"])
    )

    text = cli(db, "audit", "verify")
    assert text.returncode == 4
    assert f"BROKEN  {broken[0]['kind']:<10} {aggregate_id}  at position {position}: the " in (
        text.stdout
    )

    one = run_cli(
        "audit", "verify", "inv-a", "--json", cwd=db.parent, db="sqlite:///audit.db", timeout=60
    )
    assert one.returncode == 4
    assert any(json.loads(line).get("broken_at") == position for line in one.stdout.splitlines())

    checkpoint = run_cli(
        "audit", "checkpoint", "--out", "cp.txt", cwd=db.parent, db="sqlite:///audit.db"
    )
    assert checkpoint.returncode == 0, checkpoint.stderr
    against = cli(db, "audit", "verify", "--against", "cp.txt")
    assert against.returncode == 4
    assert f"at position {position}" in against.stdout


def test_an_untouched_store_still_verifies(db: Path) -> None:
    """The replay accepts every history the runtime writes (here: a read, a write, an
    answer), so a store nobody touched verifies as before."""
    done = cli(db, "audit", "verify")
    assert done.returncode == 0, done.stdout


def test_the_pure_check_names_the_phase_and_the_event(db: Path) -> None:
    """The rule without the CLI: the core's own transitions, replayed."""
    events = list(enumerate(stored(db, "inv-a"), start=1))
    assert transition_problem(INVOCATION, events) is None
    last = events[-1][1]
    again = last.model_copy(update={"originator_version": last.originator_version + 1})
    refused = transition_problem(INVOCATION, [*events, (len(events) + 1, again)])
    assert refused is not None
    assert refused[0] == len(events) + 1
    assert refused[1].startswith(
        "the invocation's transitions refuse it: Terminated refused in phase terminated"
    )
