"""Audit formats: new events are hashed as stored (format 2); a store of format 1 still verifies."""

from __future__ import annotations

import copy
import hashlib
import json
import sqlite3
import subprocess
import sys
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from aggregates.audit import (
    GENESIS,
    PACK_DICTIONARY,
    PACKED_DEFLATE,
    chain_hash_of,
    event_body,
    split_stored,
    stored_header,
    stored_link,
    unpack_state,
    verify_records,
)
from aggregates.decisions import Budget, Final, Usage
from aggregates.events import stored_body
from aggregates.invocation import Invocation
from loop_actors import Runtime
from loop_actors.store.store import EventStore
from tests.support.audit import AGENT
from tests.support.cli import run_cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "audit-format-1.sql"
FIXTURE_2 = Path(__file__).resolve().parents[1] / "fixtures" / "audit-format-2.sql"
VERIFY_EXPORT = Path(__file__).resolve().parents[2] / "docs" / "examples" / "verify_export.py"


def restored(fixture: Path, path: Path) -> Path:
    connection = sqlite3.connect(path)
    connection.executescript(fixture.read_text())
    connection.execute("PRAGMA journal_mode=WAL")  # as every store is
    connection.close()
    return path


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    """The store the code before format 2 wrote (tests/fixtures/audit-format-1.sql)."""
    return restored(FIXTURE, tmp_path / "audit.db")


@pytest.fixture
def json_store(tmp_path: Path) -> Path:
    """A store of format 2 written before rows were packed (tests/fixtures/audit-format-2.sql)."""
    return restored(FIXTURE_2, tmp_path / "audit.db")


def verify(db: Path) -> tuple[int, list[dict[str, object]]]:
    result = run_cli("audit", "verify", "--json", "--no-state", cwd=db.parent, db=f"sqlite:///{db}")
    return result.returncode, [json.loads(line) for line in result.stdout.splitlines()]


def documented_hash_and_body(topic: str, state: bytes) -> tuple[str, bytes]:
    """A stored state's hash and body, taken apart with zlib as the reference says."""
    if topic == "aggregates.effect:EffectPrepared":
        assert state.startswith(b'{"chain_hash":"')
        return state[15:79].decode(), b"{" + state[81:]
    assert state[0] in (1, 2), "every other row is packed"
    digest, body = state[1:33].hex(), state[33:]
    if state[0] == 2:
        body = zlib.decompressobj(-15, zdict=PACK_DICTIONARY).decompress(body)
    return digest, body


def states(db: Path) -> list[tuple[str, int, str, bytes]]:
    connection = sqlite3.connect(db)
    rows = connection.execute(
        "SELECT originator_id, originator_version, topic, state FROM stored_events ORDER BY rowid"
    ).fetchall()
    connection.close()
    return [(str(i), int(v), str(t), bytes(s)) for i, v, t, s in rows]


def test_a_store_written_in_format_1_verifies_and_grows_in_format_2(old_store: Path) -> None:
    """Bad input: none. Every old row verifies; a new run on the same store adds rows of
    format 2; both kinds verify together, and the old invocations still load."""
    assert all(not state.startswith(b'{"chain_hash"') for *_, state in states(old_store))
    code, reports = verify(old_store)
    assert code == 0, [r for r in reports if r.get("intact") is False]

    async def grow() -> None:
        with trio.fail_after(60):
            async with Runtime(f"sqlite:///{old_store}") as runtime:
                await runtime.run(AGENT, "refund", invocation_id="inv-new")
                assert (await runtime.load("inv-a")).phase.value == "terminated"

    trio.run(grow)
    new = [row for row in states(old_store) if row[0] == "inv-new"]
    assert new
    assert all(split_stored(unpack_state(state)) is not None for *_, state in new)
    code, _ = verify(old_store)
    assert code == 0


def test_a_store_of_format_2_as_json_verifies_loads_and_grows_packed(json_store: Path) -> None:
    """Bad input: none. Its JSON rows verify and load (a paused then cancelled one too), a
    finished one resumes to its outcome; a new run adds packed rows; both verify together."""
    assert all(state.startswith(b'{"chain_hash":"') for *_, state in states(json_store))
    code, reports = verify(json_store)
    assert code == 0, [r for r in reports if r.get("intact") is False]

    async def grow() -> None:
        with trio.fail_after(60):
            async with Runtime(f"sqlite:///{json_store}") as runtime:
                await runtime.run(AGENT, "refund", invocation_id="inv-new")
                assert (await runtime.load("inv-a")).phase.value == "terminated"
                assert (await runtime.load("inv-c")).phase.value == "terminated"
                again = await runtime.resume("inv-b", AGENT)
                assert again.answer == "refunded 40 under refund-under-100"

    trio.run(grow)
    new = [(topic, state) for i, _, topic, state in states(json_store) if i == "inv-new"]
    assert new
    assert all(state[0] == PACKED_DEFLATE for _, state in new)
    code, reports = verify(json_store)
    assert code == 0, [r for r in reports if r.get("intact") is False]


@pytest.mark.parametrize("fixture", [FIXTURE, FIXTURE_2], ids=["format-1", "format-2-json"])
def test_a_changed_byte_of_an_old_row_is_still_found(tmp_path: Path, fixture: Path) -> None:
    """Bad input: the answer in inv-b's Terminated (format 1, or format 2 stored as JSON)
    changed by hand."""
    db = restored(fixture, tmp_path / "audit.db")
    connection = sqlite3.connect(db)
    with connection:
        changed = connection.execute(
            "UPDATE stored_events SET state = CAST(replace(CAST(state AS TEXT), 'refunded 40', "
            "'refunded 90') AS BLOB) WHERE originator_id = 'inv-b' AND topic LIKE '%Terminated'"
        ).rowcount
    connection.close()
    assert changed == 1
    code, reports = verify(db)
    assert code == 4
    (broken,) = [r for r in reports if r.get("intact") is False]
    assert (broken["id"], broken["broken_at"]) == ("inv-b", 9)


@pytest.mark.parametrize(
    ("fixture", "audit_format"), [(FIXTURE, None), (FIXTURE_2, 2)], ids=["format-1", "format-2"]
)
def test_an_old_export_verifies_with_the_standalone_script(
    tmp_path: Path, fixture: Path, audit_format: int | None
) -> None:
    db = restored(fixture, tmp_path / "audit.db")
    export = run_cli("history", "inv-a", "--json", cwd=db.parent, db=f"sqlite:///{db}")
    records = [json.loads(line) for line in export.stdout.splitlines()]
    assert [record.get("format") for record in records] == [audit_format] * 9
    assert verify_records(records) is None
    script = subprocess.run(
        [sys.executable, str(VERIFY_EXPORT)],
        input=export.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    assert script.returncode == 0, script.stdout + script.stderr


def test_a_format_2_hash_is_the_sha256_of_the_bytes_as_stored(tmp_path: Path) -> None:
    """Recomputed here from the rows alone, with hashlib and json, as the reference says:
    the previous hash, the header [id, position, topic], and the state without its first
    member; and decoding then encoding a stored event gives its bytes back."""
    db = tmp_path / "audit.db"

    async def go() -> None:
        async with Runtime(f"sqlite:///{db}") as runtime:
            await runtime.run(AGENT, "refund", invocation_id="inv-a")

    trio.run(go)
    previous: dict[str, str] = {}
    rows = states(db)
    for originator_id, version, topic, state in rows:
        digest, body = documented_hash_and_body(topic, state)
        header = json.dumps([originator_id, version, topic], separators=(",", ":"))
        hashed = previous.get(originator_id, GENESIS).encode() + b"\n" + header.encode()
        assert hashlib.sha256(hashed + b"\n" + body).hexdigest() == digest
        assert json.loads(body)["audit_format"] == 2
        previous[originator_id] = digest
    store = EventStore(f"sqlite:///{db}")
    try:
        events = store.events("inv-a")
        again = [store.app.mapper.to_stored_event(event).state for event in events]
    finally:
        store.close()
    assert again == [state for i, _, _, state in rows if i == "inv-a"]


@given(st.text(), st.integers(min_value=1, max_value=2**63 - 1), st.text())
def test_the_hashed_header_is_the_documented_json_array(
    originator_id: str, version: int, topic: str
) -> None:
    """The header the hash is built with is ``json.dumps([id, version, topic], ...)``, byte
    for byte, for any id and topic (quotes, control characters, non-ASCII, surrogates)."""
    documented = stored_header(originator_id, version, topic)
    body = b'{"x":1}'
    expected = hashlib.sha256(f"{GENESIS}\n{documented}\n".encode() + body).hexdigest()
    assert stored_link(GENESIS, originator_id, version, topic, body) == expected


def test_a_new_events_body_is_kept_for_the_store_and_is_no_part_of_the_event() -> None:
    """The body an event was hashed over is kept for the store (which writes it, not a
    second encoding); it is not one of the event's fields: not dumped, compared or
    copied, and an event decoded from a row has none (the store encodes it again)."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    invocation = Invocation.start(
        invocation_id="inv-kept",
        goal="g",
        agent_name="a",
        agent_version="1",
        catalogue_digest="d",
        tools=[],
        budget=Budget(),
        at=at,
    )
    invocation.propose(Final(answer="done"), usage=Usage(input_tokens=3), at=at)
    store = EventStore("memory://")
    mapper = store.app.mapper
    previous = GENESIS
    try:
        for event in invocation.take_events():
            body = stored_body(event)
            assert body == event_body(event)
            assert event.chain_hash == chain_hash_of(previous, event)
            previous = event.chain_hash
            copied = event.model_copy()
            restored = copy.deepcopy(event)
            decoded = mapper.to_domain_event(mapper.to_stored_event(event))
            for other in (copied, restored, decoded):
                assert other == event
                assert other.model_dump() == event.model_dump()
                assert stored_body(other) is None
                assert mapper.to_stored_event(other) == mapper.to_stored_event(event)
            assert body not in event.__dict__.values()
            assert set(event.model_dump()) == set(type(event).model_fields)
    finally:
        store.close()
