"""The one SQL dialect: statements written once with ``?`` read the same on both engines."""

from __future__ import annotations

import sqlite3

import pytest

from projections.dialect import POSTGRESQL, SQLITE, Dialect


def test_a_dialect_is_named_by_its_engine() -> None:
    """``cursor.dialect.name`` is documented as ``sqlite`` or ``postgresql``; so is the value."""
    assert [(d.name, d.value) for d in Dialect] == [
        ("sqlite", "sqlite"),
        ("postgresql", "postgresql"),
    ]
    assert Dialect("postgresql") is POSTGRESQL
    assert SQLITE is Dialect.sqlite


def test_placeholders_become_psycopgs_outside_quoted_text_only() -> None:
    statement = "SELECT '?%' AS a, \"we?ird\" FROM t WHERE x = ? AND y LIKE ? || '%'"
    assert SQLITE.sql(statement) == statement
    assert POSTGRESQL.sql(statement) == (
        "SELECT '?%%' AS a, \"we?ird\" FROM t WHERE x = %s AND y LIKE %s || '%%'"
    )


def test_a_literal_percent_outside_quotes_is_escaped_for_psycopg() -> None:
    assert POSTGRESQL.sql("SELECT 7 % ?") == "SELECT 7 %% %s"


@pytest.mark.parametrize("count", [1, 3])
def test_any_of_names_every_value_on_sqlite_and_one_array_on_postgresql(count: int) -> None:
    values = [f"v{i}" for i in range(count)]
    assert SQLITE.any_of(count) == f"IN ({', '.join('?' * count)})"
    assert SQLITE.any_of_parameters(values) == tuple(values)
    assert POSTGRESQL.any_of(count) == "= ANY(?)"
    assert POSTGRESQL.any_of_parameters(values) == (values,)


def test_engine_specific_spellings() -> None:
    assert (SQLITE.for_update, POSTGRESQL.for_update) == ("", " FOR UPDATE")
    assert (SQLITE.skip_locked, POSTGRESQL.skip_locked) == ("", " FOR UPDATE SKIP LOCKED")
    assert (SQLITE.row_id, POSTGRESQL.row_id) == ("rowid", "notification_id")


def test_a_quoted_identifier_escapes_its_quotes() -> None:
    """Bad input tried: a schema name with a double quote in it stays one identifier."""
    assert SQLITE.quoted('we"ird') == '"we""ird"'
    connection = sqlite3.connect(":memory:")
    name = SQLITE.quoted('we"ird')
    connection.execute(f"CREATE TABLE {name} (x)")
    found = connection.execute(SQLITE.has_table_sql(), ('we"ird',)).fetchone()
    assert found == (1,)
    assert connection.execute(SQLITE.has_table_sql(), ("absent",)).fetchone() is None
