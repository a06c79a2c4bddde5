"""Fixture stores restored into a new SQLite file or a new PostgreSQL database, for a test.

The fixtures are a SQLite file's ``.dump`` and a plain ``pg_dump`` of the same
invocations (``tests/support/fixture_stores*.py`` wrote them). A test restores one into
a new store and runs the installed ``loop-actors`` command on it, in a real process, as
a user would (:class:`Restored`).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.conftest import REQUIRE_POSTGRES_ENV, postgres_admin_url
from tests.fixture_agents import DESK_ENV, RefundDesk
from tests.support.fixture_stores import REPO, cli, restore_sqlite

BACKENDS = ["sqlite", "postgresql"]


@dataclass(frozen=True)
class Restored:
    """A fixture restored into a new store, and the refund desk its resumed runs write to."""

    backend: str
    url: str
    desk: RefundDesk

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``loop-actors ARGS --db URL`` from the repository's root (never raises)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOP_ACTORS_")}
        env[DESK_ENV] = str(self.desk.path)
        return subprocess.run(
            [cli(), *args, "--db", self.url],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def json_lines(self, *args: str) -> list[dict[str, Any]]:
        """The JSON objects, one a line, of a command that must exit 0."""
        result = self.cli(*args, "--json")
        assert result.returncode == 0, result.stderr
        return [json.loads(line) for line in result.stdout.splitlines()]


def restore_postgres(dump: Path, url: str) -> None:
    """Replay a plain ``pg_dump`` (statements and ``COPY ... FROM stdin`` blocks) into ``url``.

    psql's own meta-commands (``\\restrict``) are skipped: nothing here needs psql.
    """
    import psycopg

    lines = iter(dump.read_text().splitlines(keepends=True))
    statement: list[str] = []
    with psycopg.connect(url, autocommit=True) as connection, connection.cursor() as cursor:
        for line in lines:
            if not statement and (not line.strip() or line.startswith(("--", "\\"))):
                continue
            statement.append(line)
            if not line.rstrip().endswith(";"):
                continue
            sql = "".join(statement).strip()
            statement = []
            if sql.startswith("COPY ") and sql.endswith("FROM stdin;"):
                with cursor.copy(sql.removesuffix(";")) as copy:
                    for row in lines:
                        if row.rstrip("\n") == "\\.":
                            break
                        copy.write(row)
            else:
                cursor.execute(sql)
    assert not statement, statement


@contextmanager
def restored_store(
    backend: str, folder: Path, sqlite_dump: Path, postgres_dump: Path
) -> Iterator[Restored]:
    """A fixture restored into a new SQLite file, or a new PostgreSQL database dropped after."""
    desk = RefundDesk(folder / "desk.db")
    if backend == "sqlite":
        yield Restored(backend, restore_sqlite(sqlite_dump, folder / "store.db"), desk)
        return
    import psycopg

    admin = postgres_admin_url()
    name = f"la_test_{uuid.uuid4().hex[:16]}"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as error:
        if os.environ.get(REQUIRE_POSTGRES_ENV) == "1":
            pytest.fail(f"the PostgreSQL server at {admin} does not answer: {error}")
        pytest.skip(f"the PostgreSQL server at {admin} does not answer: {error}")
    url = urlunsplit(urlsplit(admin)._replace(path=f"/{name}"))
    try:
        restore_postgres(postgres_dump, url)
        yield Restored(backend, url, desk)
    finally:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
