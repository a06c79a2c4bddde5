"""What a store's files hold, readable: for tests that look for a value in them."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from aggregates.audit import PackedStateError, unpack_state


def readable_bytes(paths: Iterable[Path]) -> bytes:
    """Every byte of the files, and every stored event's state unpacked.

    Most event rows are stored packed, their bodies compressed
    (docs/reference/audit-format.md): a value in one does not show in the file's bytes,
    so a test that a value is *not* stored must look at the unpacked states too.
    """
    chunks: list[bytes] = []
    for path in paths:
        raw = path.read_bytes()
        chunks.append(raw)
        if raw.startswith(b"SQLite format 3\x00"):
            chunks += _unpacked_states(path)
    return b"".join(chunks)


def _unpacked_states(path: Path) -> list[bytes]:
    connection = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master")}
        if "stored_events" not in tables:
            return []
        rows = connection.execute("SELECT state FROM stored_events").fetchall()
    finally:
        connection.close()
    states: list[bytes] = []
    for (state,) in rows:
        with contextlib.suppress(PackedStateError):  # a ciphertext may begin like a packed row
            states.append(unpack_state(bytes(state)))
    return states
