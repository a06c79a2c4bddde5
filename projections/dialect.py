"""The one SQL dialect: what SQLite and PostgreSQL spell differently, for every statement we write.

Every statement of the store's recorders, the work queue, the sealed secrets and the
read models is written once, in the SQLite style with ``?`` placeholders, and
:meth:`Dialect.sql` gives it to PostgreSQL in psycopg's ``%s`` style. What cannot be
written once (a catalogue query, a row id, a lock) is a member of :class:`Dialect`.

It lives here, not in ``loop_actors.store``, because the read models' cursor
(``projections.sql.ViewCursor``, which a read model's own code receives) needs it too,
and ``projections`` may not import ``loop_actors``; the store imports it from here.
"""

from __future__ import annotations

import enum
from functools import cache


class Dialect(enum.Enum):
    """The two SQL engines a store (and its read models) can live in.

    A member's ``name`` and ``value`` are the engine's name, ``sqlite`` or
    ``postgresql`` (a read model tells them apart with ``cursor.dialect.name``).
    """

    sqlite = "sqlite"
    postgresql = "postgresql"

    @property
    def for_update(self) -> str:
        """Appended to a SELECT that locks the rows it reads until the transaction ends.

        Nothing on SQLite (a write transaction holds the whole file), `` FOR UPDATE`` on
        PostgreSQL.
        """
        return " FOR UPDATE" if self is Dialect.postgresql else ""

    @property
    def skip_locked(self) -> str:
        """Appended to a SELECT of candidates that others may be claiming at the same time."""
        return " FOR UPDATE SKIP LOCKED" if self is Dialect.postgresql else ""

    @property
    def row_id(self) -> str:
        """The events table's notification id column (SQLite's row id is eventsourcing's)."""
        return "notification_id" if self is Dialect.postgresql else "rowid"

    def sql(self, statement: str) -> str:
        """``statement``, written with ``?`` placeholders, in this engine's parameter style.

        On PostgreSQL ``?`` becomes ``%s`` and a literal ``%`` becomes ``%%``, outside
        quoted text (psycopg reads ``%`` as the start of a placeholder).
        """
        if self is Dialect.sqlite:
            return statement
        return _format_style(statement)

    def any_of(self, count: int) -> str:
        """A condition's right-hand side matching any of ``count`` values.

        ``IN (?,?,...)`` with ``count`` parameters on SQLite; ``= ANY(?)`` with one
        parameter, a list (:meth:`any_of_parameters`), on PostgreSQL: one statement
        and one plan whatever the count.
        """
        if self is Dialect.postgresql:
            return "= ANY(?)"
        return f"IN ({marks(count)})"

    def any_of_parameters(self, values: list[str]) -> tuple[object, ...]:
        """The parameters of :meth:`any_of` for ``values``."""
        if self is Dialect.postgresql:
            return (values,)
        return tuple(values)

    def quoted(self, name: str) -> str:
        """An identifier, quoted as both engines read a quoted identifier."""
        return '"' + name.replace('"', '""') + '"'

    def has_table_sql(self) -> str:
        """A SELECT of one row when the table named by its one parameter exists.

        On PostgreSQL the parameter is a qualified, quoted name (``"schema"."table"``).
        """
        if self is Dialect.postgresql:
            return "SELECT 1 WHERE to_regclass(?) IS NOT NULL"
        return "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"


@cache
def _format_style(statement: str) -> str:
    """``?`` placeholders as ``%s`` and ``%`` as ``%%``, outside quoted text."""
    out: list[str] = []
    quote: str | None = None
    for char in statement:
        if quote is not None:
            out.append("%%" if char == "%" else char)
            if char == quote:
                quote = None
        elif char in ("'", '"'):
            quote = char
            out.append(char)
        elif char == "?":
            out.append("%s")
        elif char == "%":
            out.append("%%")
        else:
            out.append(char)
    return "".join(out)


def marks(count: int) -> str:
    """``?, ?, ...``: ``count`` placeholders."""
    return ", ".join("?" * count)


SQLITE = Dialect.sqlite
"""The SQLite dialect (a shorter name)."""
POSTGRESQL = Dialect.postgresql
"""The PostgreSQL dialect (a shorter name)."""
