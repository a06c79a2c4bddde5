"""The packed layout: most rows are stored as their hash in 32 bytes and a compressed body.

It is a lossless encoding of the format-2 state (docs/reference/audit-format.md): what
the hash covers, what verify checks and what every reader decodes are unchanged; what a
tamperer edits in a packed row is found where it is.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import zlib
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from aggregates.audit import (
    MAX_DEFLATED_BODY,
    PACK_DICTIONARY,
    PACKED_DEFLATE,
    PACKED_PLAIN,
    PackedStateError,
    is_packed,
    pack_state,
    stored_state,
    unpack_state,
)
from loop_actors import Runtime
from loop_actors.store.sqlite_recorder import LeanSQLiteRecorder
from loop_actors.store.store import EventStore
from tests.support.audit import AGENT
from tests.support.cli import run_cli

DIGESTS = st.binary(min_size=32, max_size=32).map(bytes.hex)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
BODIES = st.dictionaries(st.text(min_size=1), JSON_VALUES, min_size=1, max_size=6).map(
    lambda body: json.dumps(body, ensure_ascii=False).encode()
)


@given(DIGESTS, BODIES, st.booleans())
def test_a_packed_state_unpacks_to_the_json_state_byte_for_byte(
    digest: str, body: bytes, deflate: bool
) -> None:
    """For any hash and any JSON body, compressed or not, and never larger than plain."""
    state = stored_state(digest, body)
    packed = pack_state(state, deflate=deflate)
    assert is_packed(packed)
    assert packed[1:33] == bytes.fromhex(digest)
    assert unpack_state(packed) == state
    assert len(packed) <= 1 + 32 + len(body)
    assert packed[0] == (PACKED_DEFLATE if len(packed) < 1 + 32 + len(body) else PACKED_PLAIN)


def test_a_state_not_laid_out_as_format_2_is_left_as_it_is() -> None:
    """Bad input: a format-1 state (its hash not its first member) and a bare JSON object."""
    format_1 = b'{"timestamp":"2026-12-01T00:00:00Z","chain_hash":"' + b"0" * 64 + b'"}'
    for state in (format_1, b'{"a":1}'):
        assert pack_state(state, deflate=True) == state
        assert unpack_state(state) == state


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda packed: packed[:-3], "does not end where its row does"),
        (lambda packed: packed + b"\x00", "does not end where its row does"),
        (lambda packed: packed[:33] + b"\xff" * 8, "does not decompress"),
        (lambda packed: bytes((PACKED_PLAIN,)) + packed[1:33] + b"[1]", "not a JSON object"),
    ],
)
def test_a_damaged_packed_state_is_refused_typed(damage: Any, problem: str) -> None:
    """Bad input: a packed body cut short, with bytes after its end, not DEFLATE, not JSON."""
    state = stored_state(
        "ab" * 32, b'{"timestamp":"2026-12-01T00:00:00Z","step":1,"x":"' + b"y" * 50 + b'"}'
    )
    packed = pack_state(state, deflate=True)
    assert packed[0] == PACKED_DEFLATE
    with pytest.raises(PackedStateError, match=problem):
        unpack_state(damage(packed))


def test_a_packed_body_that_inflates_past_the_cap_is_refused_not_inflated() -> None:
    """Bad input: a forged row whose few KB inflate to more than any compressed body stored
    (a decompression bomb): refused typed, without building the inflated body."""
    head = b"ab" * 32
    body = b'{"x":"' + b"y" * (MAX_DEFLATED_BODY + 10) + b'"}'
    compressor = zlib.compressobj(
        9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, PACK_DICTIONARY
    )
    bomb = bytes((PACKED_DEFLATE,)) + bytes.fromhex(head.decode()) + compressor.compress(body)
    bomb += compressor.flush()
    assert len(bomb) < 100_000
    with pytest.raises(PackedStateError, match="inflates past"):
        unpack_state(bomb)
    # The writer never compresses a body that large: it is stored as it is, and reads back.
    state = stored_state(head.decode(), body)
    packed = pack_state(state, deflate=True)
    assert packed[0] == PACKED_PLAIN
    assert unpack_state(packed) == state


def test_the_pack_dictionary_is_the_one_the_stored_rows_were_packed_with() -> None:
    """Rows packed with it are read with it: changing it makes every such row unreadable
    (a new dictionary needs a new first byte, and this one kept for the rows that have it)."""
    assert len(PACK_DICTIONARY) == 2072
    assert (
        hashlib.sha256(PACK_DICTIONARY).hexdigest()
        == "fda1898eb654e1982343c64fbca0829177c74d2efa242ce9e54336634ae62d26"
    )


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "audit.db"

    async def run_two() -> None:
        with trio.fail_after(60):
            async with Runtime(f"sqlite:///{path}") as runtime:
                await runtime.run(AGENT, "refund", invocation_id="inv-a")
                await runtime.run(AGENT, "refund", invocation_id="inv-b")

    trio.run(run_two)
    return path


def rows(db: Path) -> list[tuple[int, str, int, str, bytes]]:
    connection = sqlite3.connect(db)
    try:
        found = connection.execute(
            "SELECT rowid, originator_id, originator_version, topic, state FROM stored_events "
            "ORDER BY rowid"
        ).fetchall()
    finally:
        connection.close()
    return [(int(r), str(i), int(v), str(t), bytes(s)) for r, i, v, t, s in found]


def test_every_row_is_packed_but_those_the_effect_index_reads_as_json(store: Path) -> None:
    """EffectPrepared rows stay JSON, and the index still finds an invocation's effects."""
    for _, _, _, topic, state in rows(store):
        if topic == "aggregates.effect:EffectPrepared":
            assert state.startswith(b'{"chain_hash":"')
        else:
            assert state[0] == PACKED_DEFLATE, topic
    events = EventStore(f"sqlite:///{store}")
    try:
        recorder = events._recorder
        assert isinstance(recorder, LeanSQLiteRecorder)
        by_index = recorder.effect_keys_of("inv-a", "aggregates.effect:EffectPrepared")
        assert by_index is not None
        # The index (SQL over the JSON rows) finds what a scan of every row finds.
        assert [effect.id for effect in events.effects_of_by_scan("inv-a")] == by_index
        assert len(by_index) == 1
    finally:
        events.close()


def verify(db: Path) -> tuple[int, list[dict[str, Any]]]:
    result = run_cli("audit", "verify", "--json", "--no-state", cwd=db.parent, db=f"sqlite:///{db}")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return result.returncode, [line for line in lines if "id" in line and not line["intact"]]


def overwrite(db: Path, rowid: int, state: bytes) -> None:
    connection = sqlite3.connect(db)
    with connection:
        connection.execute("UPDATE stored_events SET state = ? WHERE rowid = ?", (state, rowid))
    connection.close()


def row_of(db: Path, originator_id: str, version: int) -> tuple[int, bytes]:
    (found,) = [(r, s) for r, i, v, _, s in rows(db) if (i, v) == (originator_id, version)]
    return found


@pytest.mark.parametrize(
    ("where", "problem"),
    [
        (5, "does not match its stored bytes"),  # a byte of the stored hash
        (40, ""),  # a byte of the compressed body: unreadable, or another body
        (-1, ""),
    ],
)
def test_a_byte_changed_in_a_packed_row_is_found_at_its_position(
    store: Path, where: int, problem: str
) -> None:
    """Bad input: one byte of inv-a's ResultsCommitted (position 4) flipped, in its hash or
    in its compressed body, as someone editing the file without unpacking it would."""
    rowid, state = row_of(store, "inv-a", 4)
    damaged = bytearray(state)
    damaged[where] ^= 0x01
    overwrite(store, rowid, bytes(damaged))
    code, broken = verify(store)
    assert code == 4
    assert [(r["id"], r["broken_at"]) for r in broken] == [("inv-a", 4)]
    assert problem in broken[0]["problem"]


def test_a_packed_row_edited_as_its_json_and_packed_again_is_found(store: Path) -> None:
    """Bad input: inv-b's Terminated unpacked, its answer changed, packed again."""
    rowid, state = row_of(store, "inv-b", 9)
    plain = unpack_state(state)
    assert b"refunded 40" in plain
    overwrite(store, rowid, pack_state(plain.replace(b"refunded 40", b"refunded 90"), deflate=True))
    code, broken = verify(store)
    assert code == 4
    assert [(r["id"], r["broken_at"]) for r in broken] == [("inv-b", 9)]
    assert "stored bytes" in broken[0]["problem"]


@pytest.mark.parametrize(
    "settings",
    [
        {"COMPRESSOR_TOPIC": "eventsourcing.compressor:ZlibCompressor"},
        {"CIPHER_TOPIC": "eventsourcing.cipher:AESCipher"},
    ],
)
def test_under_eventsourcing_compressor_or_cipher_rows_are_packed_but_not_compressed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, str]
) -> None:
    """Compressed once (by eventsourcing's compressor), and never under a cipher, whose
    ciphertext would then say how well a body compressed."""
    from eventsourcing.cipher import AESCipher

    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    if "CIPHER_TOPIC" in settings:
        monkeypatch.setenv("CIPHER_KEY", AESCipher.create_key(16))
    db = tmp_path / "events.db"
    outcome = Runtime(f"sqlite:///{db}").run_sync(AGENT, "refund", invocation_id="inv-a")
    assert outcome.reason == "completed"
    events = EventStore(f"sqlite:///{db}")
    try:
        mapper = events.app.mapper
        for _, _, _, topic, stored in rows(db):
            state = mapper.cipher.decrypt(stored) if mapper.cipher is not None else stored
            if mapper.compressor is not None:
                state = mapper.compressor.decompress(state)
            expected = b"{" if topic.endswith("EffectPrepared") else bytes((PACKED_PLAIN,))
            assert state[:1] == expected, topic
        assert events.get("inv-a").phase.value == "terminated"
    finally:
        events.close()
    code, broken = verify(db)
    assert (code, broken) == (0, [])
