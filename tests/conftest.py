from __future__ import annotations

import os
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio.testing


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A fresh SQLite file for one test."""
    return f"sqlite:///{tmp_path / 'test.db'}"


@pytest.fixture(params=["warnings-as-errors", "as-users-run"])
def shown_warnings(request: pytest.FixtureRequest) -> Iterator[list[warnings.WarningMessage]]:
    """Run a test twice: warnings raised as errors (the tests' setting), then as a user runs.

    As a user runs, a warning is shown, not raised: the list holds those shown, which a
    test checks is empty (pydantic's serializer warnings once hid a crash from the tests).
    """
    if request.param == "warnings-as-errors":
        yield []
        return
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        yield shown


@pytest.fixture(autouse=True)
def _verifier_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep ``audit verify``'s last-verified state (``$XDG_STATE_HOME``) out of the user's home.

    One folder per test, inherited by the CLI subprocesses the test starts; no checkpoint
    directory from the environment either.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
        for name in ("LOOP_ACTORS_CHECKPOINT_DIR", "LOOP_ACTORS_CHECKPOINT_KEY"):
            patch.delenv(name, raising=False)
        patch.delenv("LOOP_ACTORS_CHECKPOINT_EVERY", raising=False)
        yield


@pytest.fixture(autouse=True)
def _forget_modules_of_test_folders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Forget, after each test, the modules it imported from a test's folder.

    Many tests write an ``agents.py`` of their own and import it (``--agent agents:calc``
    in process, or ``from agents import ...``): left in ``sys.modules``, the next test's
    ``agents`` would be the last one's, with other agents in it. One at a time the tests
    happened to run in an order where that did not matter; in parallel workers they do not.
    """
    before = set(sys.modules)
    yield
    folders = tmp_path_factory.getbasetemp()
    for name in set(sys.modules) - before:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file and Path(file).is_relative_to(folders):
            del sys.modules[name]


@pytest.fixture
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    """Virtual time that jumps ahead only when the run has been idle for 50 ms of real time.

    Commits run on the Journal's writer thread; a zero threshold would let the
    clock jump while a commit is in flight.
    """
    mock_clock.autojump_threshold = 0.05
    return mock_clock


POSTGRES_ENV = "LOOP_ACTORS_TEST_PG"
"""The admin URL of a PostgreSQL server for the tests (``bash .ci/pg.sh url``)."""

REQUIRE_POSTGRES_ENV = "LOOP_ACTORS_REQUIRE_PG"
"""Set to 1 (``.ci/test`` does) to fail, not skip, PostgreSQL tests when no server answers."""


def postgres_admin_url() -> str:
    """The admin URL of the tests' PostgreSQL server (skip, or fail when it is required)."""
    url = os.environ.get(POSTGRES_ENV)
    required = os.environ.get(REQUIRE_POSTGRES_ENV) == "1"
    if not url:
        if required:
            pytest.fail(f"{REQUIRE_POSTGRES_ENV}=1 but {POSTGRES_ENV} is not set")
        pytest.skip(f"no PostgreSQL server: set {POSTGRES_ENV} (bash .ci/pg.sh start; url)")
    return url


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards.

    The server is the one named by ``$LOOP_ACTORS_TEST_PG`` (an admin URL, as
    printed by ``bash .ci/pg.sh url``); without it the test is skipped, unless
    ``$LOOP_ACTORS_REQUIRE_PG=1``, when it fails.
    """
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
    parts = urlsplit(admin)
    yield urlunsplit(parts._replace(path=f"/{name}"))
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty store on each kind of server: a SQLite file, and a PostgreSQL database.

    The PostgreSQL one is a fresh database from :func:`postgres_url` (skipped
    without a server, unless ``$LOOP_ACTORS_REQUIRE_PG=1``).
    """
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url
