"""The audit trail: tampering done directly on the SQLite rows is detected and located."""

from __future__ import annotations

import itertools
import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from aggregates.audit import canonical_bytes, verify_records
from loop_actors import Runtime
from tests.support.audit import AGENT, tamperable
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "audit.db"

    async def run_two() -> None:
        async with Runtime(f"sqlite:///{path}") as runtime:
            await runtime.run(AGENT, "refund", invocation_id="inv-a")
            await runtime.run(AGENT, "refund", invocation_id="inv-b")

    trio.run(run_two)
    return path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, db="sqlite:///audit.db", timeout=60)


def verify(store: Path, *ids: str) -> tuple[int, list[dict[str, Any]]]:
    result = cli("audit", "verify", *ids, "--json", cwd=store.parent)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    # The aggregates' reports (the log's and the coverage lines have no id).
    return result.returncode, [line for line in lines if "id" in line]


def sql(store: Path, statement: str, *params: Any) -> None:
    connection = tamperable(store)
    with connection:
        changed = connection.execute(statement, params).rowcount
    connection.close()
    assert changed >= 1


def broken(reports: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    return [(r["kind"], r["id"], r["broken_at"]) for r in reports if r["broken_at"] is not None]


def test_an_untouched_store_verifies_and_names_every_head_hash(store: Path) -> None:
    code, reports = verify(store)
    assert code == 0
    assert [(r["kind"], r["id"]) for r in reports if r["kind"] == "invocation"] == [
        ("invocation", "inv-a"),
        ("invocation", "inv-b"),
    ]
    assert len([r for r in reports if r["kind"] == "effect"]) == 2
    assert all(r["head_hash"] for r in reports)
    text = cli("audit", "verify", cwd=store.parent)
    assert text.returncode == 0
    assert "4 intact, 0 broken" in text.stdout
    assert "every stored row checked" in text.stdout


def test_an_edited_row_is_detected_at_its_position(store: Path) -> None:
    sql(
        store,
        "UPDATE stored_events SET state = repacked(state, CAST(replace(CAST(plain(state) AS TEXT), "
        "'refund-under-100', 'refund-under-999') AS BLOB)) "
        "WHERE originator_id = 'inv-a' AND originator_version = 4",
    )
    code, reports = verify(store)
    assert code == 4
    assert broken(reports) == [("invocation", "inv-a", 4)]


def test_a_deleted_row_is_detected_at_its_position(store: Path) -> None:
    sql(store, "DELETE FROM stored_events WHERE originator_id = 'inv-b' AND originator_version = 3")
    code, reports = verify(store, "inv-b")
    assert code == 4
    (report,) = [r for r in reports if r["kind"] == "invocation"]
    assert report["broken_at"] == 3
    assert "missing" in report["problem"]


def test_an_inserted_row_is_detected(store: Path) -> None:
    sql(
        store,
        "INSERT INTO stored_events SELECT originator_id, 10, topic, state FROM stored_events "
        "WHERE originator_id = 'inv-a' AND originator_version = 5",
    )
    code, reports = verify(store, "inv-a")
    assert code == 4
    assert broken(reports)[0][:2] == ("invocation", "inv-a")


def test_reordered_rows_are_detected(store: Path) -> None:
    connection = sqlite3.connect(store)
    with connection:
        rows = dict(
            connection.execute(
                "SELECT originator_version, state FROM stored_events "
                "WHERE originator_id = 'inv-a' AND originator_version IN (4, 7)"
            ).fetchall()
        )
        topics = dict(
            connection.execute(
                "SELECT originator_version, topic FROM stored_events "
                "WHERE originator_id = 'inv-a' AND originator_version IN (4, 7)"
            ).fetchall()
        )
        for version, other in ((4, 7), (7, 4)):
            connection.execute(
                "UPDATE stored_events SET state = ?, topic = ? "
                "WHERE originator_id = 'inv-a' AND originator_version = ?",
                (rows[other], topics[other], version),
            )
    connection.close()
    code, reports = verify(store, "inv-a")
    assert code == 4
    assert broken(reports) == [("invocation", "inv-a", 4)]


def test_an_edited_effect_row_is_detected_in_the_effect_chain(store: Path) -> None:
    sql(
        store,
        "UPDATE stored_events SET state = repacked(state, CAST(replace(CAST(plain(state) AS TEXT), "
        "'\"amount\":40', '\"amount\":4000') AS BLOB)) "
        "WHERE originator_id LIKE 'eff-%' AND CAST(plain(state) AS TEXT) LIKE '%amount%'",
    )
    code, reports = verify(store)
    assert code == 4
    kinds = {kind for kind, _, _ in broken(reports)}
    assert kinds == {"effect"}


def test_the_exported_history_verifies_without_the_runtime(store: Path) -> None:
    export = cli("history", "inv-a", "--json", cwd=store.parent)
    records = [json.loads(line) for line in export.stdout.splitlines()]
    assert verify_records(records) is None
    assert records[0]["previous_hash"] == "0" * 64
    assert all(r["previous_hash"] == p["hash"] for p, r in itertools.pairwise(records))
    records[2]["data"]["step"] = 99
    failure = verify_records(records)
    assert failure is not None
    assert failure.position == 3


def test_an_effect_whose_rows_were_all_deleted_is_reported_broken(store: Path) -> None:
    sql(store, "DELETE FROM stored_events WHERE originator_id LIKE 'eff-%'")
    code, reports = verify(store, "inv-a")
    assert code == 4
    (effect,) = [r for r in reports if r["kind"] == "effect"]
    assert (effect["broken_at"], effect["events"]) == (1, 0)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_the_canonical_bytes_are_the_documented_json_form(value: Any) -> None:
    """The hashed form stays ``json.dumps(sort_keys, compact, ensure_ascii=False)``, byte for byte.

    Old chains verify only if this never changes (the encoder is built once for speed).
    """
    documented = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_bytes({"data": value}) == ('{"data":' + documented + "}").encode()


def test_a_value_json_cannot_encode_is_refused_by_the_canonical_form() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        canonical_bytes({"data": object()})
