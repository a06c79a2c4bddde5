"""A cursor that takes the runtime's ``?`` statements on either engine.

The store's recorders, the work queue and the sealed secrets write each statement
once, in the SQLite style (``?`` placeholders); :class:`PlaceholderCursor` gives it to
the engine's own cursor in that engine's style (``projections.dialect.Dialect.sql``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from projections.dialect import Dialect


class Cursor(Protocol):
    """The part of a DB-API cursor the runtime's statements use."""

    def execute(self, statement: str, parameters: Sequence[Any] = ()) -> Any:
        """Run one statement."""

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> Any:
        """Run one statement for each row of parameters."""

    def fetchone(self) -> Any:
        """The next row, or None."""

    def fetchall(self) -> list[Any]:
        """The remaining rows."""

    @property
    def rowcount(self) -> int:
        """The rows the last statement changed."""


class PlaceholderCursor:
    """A DB-API cursor (sqlite3's, psycopg's) that takes ``?`` statements.

    On PostgreSQL each statement is turned into psycopg's ``%s`` style first (cached
    by statement). Rows are the engine's own rows, read by position.
    """

    def __init__(self, cursor: Any, dialect: Dialect) -> None:
        self._cursor = cursor
        self._dialect = dialect

    def execute(self, statement: str, parameters: Sequence[Any] = ()) -> Any:
        """Run one statement."""
        return self._cursor.execute(self._dialect.sql(statement), tuple(parameters))

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> Any:
        """Run one statement for each row of parameters."""
        return self._cursor.executemany(self._dialect.sql(statement), rows)

    def fetchone(self) -> Any:
        """The next row, or None."""
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        """The remaining rows."""
        return list(self._cursor.fetchall())

    @property
    def rowcount(self) -> int:
        """The rows the last statement changed."""
        return int(self._cursor.rowcount)
