"""The audit on a PostgreSQL store: tampering done on its rows with SQL is found and located.

The same checks as on SQLite (tests/audit/test_audit.py, tests/audit/test_audit_checkpoint.py),
through the CLI, with the rows changed as someone with ``psql`` would.

Bad inputs tried: an edited row, a deleted row, every row of an invocation
deleted, the last rows of the log deleted after a signed checkpoint; and a hole a conflict leaves in the ids (not a deletion).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from eventsourcing.persistence import IntegrityError

from aggregates.audit import PACKED_DEFLATE, is_packed, pack_state, unpack_state
from loop_actors import Runtime
from tests.support.audit import AGENT
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

EVENTS = "loopactors_events"
"""eventsourcing names the events table after the application (``LoopActors``)."""


@pytest.fixture
def store(postgres_url: str) -> str:
    """A PostgreSQL store of two invocations."""

    async def run_two() -> None:
        with trio.fail_after(60):
            async with Runtime(postgres_url) as runtime:
                await runtime.run(AGENT, "refund", invocation_id="inv-a")
                await runtime.run(AGENT, "refund", invocation_id="inv-b")

    trio.run(run_two)
    return postgres_url


def cli(store: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, db=store, timeout=60)


def reports(store: str, *args: str, cwd: Path) -> tuple[int, list[dict[str, Any]]]:
    result = cli(store, "audit", "verify", *args, "--json", cwd=cwd)
    assert result.returncode in (0, 4), result.stderr
    return result.returncode, [json.loads(line) for line in result.stdout.splitlines()]


def sql(store: str, statement: str, *params: Any) -> int:
    with psycopg.connect(store, autocommit=True) as connection:
        return connection.execute(statement, params).rowcount


def test_an_untouched_postgresql_store_verifies_every_row(store: str, tmp_path: Path) -> None:
    code, lines = reports(store, cwd=tmp_path)
    assert code == 0
    invocations = [line["id"] for line in lines if line["kind"] == "invocation"]
    assert invocations == ["inv-a", "inv-b"]
    (coverage,) = [line for line in lines if line["kind"] == "coverage"]
    assert coverage["rows"] + coverage["snapshots"] == coverage["store_rows"]


def test_rows_on_postgresql_are_packed_as_on_sqlite(store: str) -> None:
    """The mapper is the same: every row packed and compressed, but EffectPrepared's (JSON)."""
    with psycopg.connect(store, autocommit=True) as connection:
        found = connection.execute(f"SELECT topic, state FROM {EVENTS}").fetchall()  # noqa: S608
    assert len(found) == 24
    for topic, state in found:
        if topic == "aggregates.effect:EffectPrepared":
            assert bytes(state).startswith(b'{"chain_hash":"')
        else:
            assert state[0] == PACKED_DEFLATE, topic


def test_an_edited_row_on_postgresql_is_detected_at_its_position(
    store: str, tmp_path: Path
) -> None:
    where = "WHERE originator_id = 'inv-a' AND originator_version = 4"
    with psycopg.connect(store, autocommit=True) as connection:
        found = connection.execute(f"SELECT state FROM {EVENTS} {where}").fetchone()  # noqa: S608
    assert found is not None
    (state,) = found
    # The row is packed (its body compressed), as on SQLite: edited as its JSON, packed again.
    assert is_packed(state)
    plain = unpack_state(state).replace(b"refund-under-100", b"refund-under-999")
    edited = pack_state(plain, deflate=state[0] == PACKED_DEFLATE)
    changed = sql(store, f"UPDATE {EVENTS} SET state = %s {where}", edited)  # noqa: S608
    assert changed == 1
    code, lines = reports(store, cwd=tmp_path)
    assert code == 4
    assert [(r["id"], r["broken_at"]) for r in lines if r.get("broken_at") is not None] == [
        ("inv-a", 4)
    ]


def test_a_deleted_row_on_postgresql_is_detected_at_its_position(
    store: str, tmp_path: Path
) -> None:
    sql(store, f"DELETE FROM {EVENTS} WHERE originator_id = 'inv-b' AND originator_version = 3")  # noqa: S608
    code, lines = reports(store, "inv-b", cwd=tmp_path)
    assert code == 4
    (report,) = [r for r in lines if r["kind"] == "invocation"]
    assert report["broken_at"] == 3


@pytest.mark.parametrize("k", [1, 4])
def test_the_last_rows_deleted_after_a_checkpoint_are_truncation_on_postgresql(
    store: str, tmp_path: Path, k: int
) -> None:
    keygen = run_cli("audit", "keygen", "--out", "ops.key", cwd=tmp_path, timeout=60)
    assert keygen.returncode == 0, keygen.stderr
    made = cli(store, "audit", "checkpoint", "--key", "ops.key", "--out", "cp.txt", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    ok, lines = reports(store, "--against", "cp.txt", "--key", "ops.key.pub", cwd=tmp_path)
    assert ok == 0
    assert [r["verdict"] for r in lines if r["kind"] == "checkpoint"] == ["ok"]
    deleted = sql(
        store,
        f"DELETE FROM {EVENTS} WHERE notification_id > "  # noqa: S608
        f"(SELECT MAX(notification_id) FROM {EVENTS}) - %s",
        k,
    )
    assert deleted == k
    code, lines = reports(store, "--against", "cp.txt", "--key", "ops.key.pub", cwd=tmp_path)
    (report,) = [r for r in lines if r["kind"] == "checkpoint" and r["source"] == "cp.txt"]
    assert (code, report["verdict"], report["store_size"]) == (4, "truncated", report["size"] - k)


def test_a_deleted_invocation_on_postgresql_is_found_against_a_checkpoint(
    store: str, tmp_path: Path
) -> None:
    """On PostgreSQL, ids have holes anyway (a rolled-back insert used its sequence
    values): a deleted invocation is found by the chain, as missing rows."""
    made = cli(store, "audit", "checkpoint", "--out", "cp.txt", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    sql(store, f"DELETE FROM {EVENTS} WHERE originator_id = 'inv-a'")  # noqa: S608
    code, lines = reports(store, "--against", "cp.txt", cwd=tmp_path)
    (report,) = [r for r in lines if r["kind"] == "checkpoint" and r["source"] == "cp.txt"]
    assert (code, report["verdict"]) == (4, "truncated")


async def test_the_hole_a_conflict_leaves_in_postgresql_ids_is_not_a_deletion(
    store: str, tmp_path: Path
) -> None:
    """A conflict (a second writer on one invocation) uses sequence values no row gets."""
    from loop_actors.store.store import EventStore
    from tests.support.events import started

    events = EventStore(store)
    first = events.events("inv-b")[0]
    with pytest.raises(IntegrityError):
        events.append([first])
    events.append(started("inv-c"))  # a row after the hole
    ids = [row[0] for row in events.log_rows()]
    events.close()
    assert ids[-1] > ids[-2] + 1
    made = await trio.to_thread.run_sync(
        lambda: cli(store, "audit", "checkpoint", "--out", "cp.txt", cwd=tmp_path)
    )
    assert made.returncode == 0, made.stderr
    code, lines = await trio.to_thread.run_sync(
        lambda: reports(store, "--against", "cp.txt", cwd=tmp_path)
    )
    (report,) = [r for r in lines if r["kind"] == "checkpoint" and r["source"] == "cp.txt"]
    assert (code, report["verdict"]) == (0, "ok")
