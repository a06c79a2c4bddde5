"""The undocumented members of eventsourcing that loop-actors relies on are still there.

An upgrade of eventsourcing that renames, removes or reshapes one of them fails
here, by name, instead of somewhere deep in a store open or a read model.
"""

from __future__ import annotations

import importlib
import inspect
import sqlite3
from pathlib import Path

import pytest
from eventsourcing.sqlite import SQLiteConnectionPool

from loop_actors.store._eventsourcing_internals import (
    RELIED_ON,
    PrivateMember,
    is_read_only_uri,
    keep_journal_mode,
)


def _defines_attribute(owner: type, attribute: str) -> bool:
    """Whether a class (or one of its bases) assigns ``self.<attribute>`` in its source."""
    for cls in owner.__mro__:
        if cls.__module__.startswith("eventsourcing") and f"self.{attribute}" in inspect.getsource(
            cls
        ):
            return True
    return False


@pytest.mark.parametrize("member", RELIED_ON, ids=lambda m: f"{m.owner}.{m.member}")
def test_every_private_member_relied_on_still_has_its_shape(member: PrivateMember) -> None:
    """Bad input tried: a renamed member and a changed parameter list (edited by hand) fail."""
    if member.module == "eventsourcing.postgres":
        pytest.importorskip("psycopg")
    owner = getattr(importlib.import_module(member.module), member.owner)
    if member.parameters is None:
        assert _defines_attribute(owner, member.member), member.used_by
        return
    method = getattr(owner, member.member)
    assert tuple(inspect.signature(method).parameters) == member.parameters, member.used_by


def test_the_sqlite_connection_is_kept_as_sqlite_conn(tmp_path: Path) -> None:
    """What projections/sql.py reads: the pool's connection keeps its sqlite3 connection."""
    pool = SQLiteConnectionPool(db_name=str(tmp_path / "x.db"))
    try:
        connection = pool.get_connection()
        assert isinstance(connection._sqlite_conn, sqlite3.Connection)
        pool.put_connection(connection)
    finally:
        pool.close()


def test_a_pool_kept_to_its_journal_mode_reads_a_rollback_journal_file_read_only(
    tmp_path: Path,
) -> None:
    """Bad input: a rollback-journal file opened ``mode=ro``; without the flag the pool writes."""
    path = tmp_path / "copy.db"
    writer = sqlite3.connect(path)
    writer.execute("CREATE TABLE t (x)")
    writer.commit()
    writer.close()
    uri = f"{path.as_uri()}?mode=ro"
    assert is_read_only_uri(uri)
    refused = SQLiteConnectionPool(db_name=uri)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        refused.get_connection()
    refused.close()
    pool = SQLiteConnectionPool(db_name=uri)
    keep_journal_mode(pool)
    try:
        connection = pool.get_connection()
        mode = connection._sqlite_conn.execute("PRAGMA journal_mode").fetchone()[0]
        pool.put_connection(connection)
    finally:
        pool.close()
    assert mode == "delete"


@pytest.mark.parametrize(
    ("name", "read_only"),
    [
        ("file:///a/b.db?mode=ro", True),
        ("file:///a/b.db?mode=ro&immutable=1", True),
        ("file:///a/b.db?mode=rw", False),
        ("file:loop-actors-1?mode=memory&cache=shared", False),
        ("/a/mode=ro.db", False),
        ("b.db", False),
    ],
)
def test_a_read_only_uri_is_told_by_its_mode_parameter(name: str, *, read_only: bool) -> None:
    """Bad inputs tried: ``mode=rw``, a memory URI, a plain path that contains ``mode=ro``."""
    assert is_read_only_uri(name) is read_only


def test_a_notification_made_at_once_is_what_eventsourcing_makes() -> None:
    """The store's lean read of notifications relies on ``Notification``'s layout: it holds.

    If an upgrade gives ``Notification`` slots or a ``__post_init__``, the store falls back
    to eventsourcing's own read; this test then fails, so the fallback is noticed.
    """
    from eventsourcing.persistence import Notification

    from loop_actors.store._eventsourcing_internals import (
        NOTIFICATIONS_SET_AT_ONCE,
        notification,
    )

    assert NOTIFICATIONS_SET_AT_ONCE, "eventsourcing's Notification changed its layout"
    made = notification(7, "inv-1", 3, "a:B", b"{}")
    built = Notification(
        originator_id="inv-1", originator_version=3, topic="a:B", state=b"{}", id=7
    )
    assert made == built
    assert list(vars(made).items()) == list(vars(built).items())
