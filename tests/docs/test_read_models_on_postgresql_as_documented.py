"""What the docs say about read models on PostgreSQL, run on a real PostgreSQL server.

Each test quotes the sentence of the docs it proves (the test fails when the page no
longer says it), then does what the sentence says. And no page says otherwise (the
API reference once said read models were not kept there and that
``follow_projections=True`` raised without ``views=``; the CLI's exit codes, that
``projections`` needed ``--views``; the index listed them as planned). Bad inputs
tried: none needed, the claims are about what works; a ``--views`` URL naming another
database is checked to leave the store's database without read models.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import trio

from loop_actors import EventStore, Runtime, open_runner
from projections import list_invocations
from tests.conftest import postgres_admin_url
from tests.support.cli import run_in_process

ROOT = Path(__file__).resolve().parents[2]

AGENTS = '''
from loop_actors import Agent, ScriptedModel, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _adding(request):
    if request.step == 1:
        return {"kind": "tool_calls", "calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}]}
    return {"kind": "final", "answer": "5"}


calc = Agent("calc", ScriptedModel(_adding), tools=[add])
'''

READ_MODEL_TABLES = {"trajectory_invocations", "metrics_invocations", "open_effects"}


def says(page: str, sentence: str) -> None:
    """Fail unless the page says this (its lines joined: a sentence may wrap)."""
    text = " ".join((ROOT / page).read_text().split())
    assert " ".join(sentence.split()) in text, f"{page} no longer says: {sentence}"


def tables(url: str) -> set[str]:
    with psycopg.connect(url, connect_timeout=5) as connection:
        rows = connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    return {name for (name,) in rows}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "agents.py").write_text(AGENTS)
    return tmp_path


@pytest.fixture
def other_database() -> Iterator[str]:
    """A second fresh database on the tests' server (for ``--views postgresql://...``)."""
    admin = postgres_admin_url()
    name = f"la_views_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    yield urlunsplit(urlsplit(admin)._replace(path=f"/{name}"))
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


CONTRADICTIONS = [
    ("docs/reference/api.md", "Read models are not kept on PostgreSQL"),
    ("docs/reference/api.md", "raises `StoreUnavailableError` without it"),
    ("docs/reference/cli.md", "`projections` on PostgreSQL without `--views`"),
    ("docs/index.md", "Read models kept on PostgreSQL"),
    (
        "docs/reference/cli.md",
        "read the read models: SQLite tables built from the events, in their own file",
    ),
]


@pytest.mark.parametrize(("page", "words"), CONTRADICTIONS)
def test_no_page_says_read_models_are_not_kept_on_postgresql(page: str, words: str) -> None:
    text = " ".join((ROOT / page).read_text().split())
    assert " ".join(words.split()) not in text


def test_follow_projections_keeps_the_read_models_in_the_stores_own_database(
    postgres_url: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    says(
        "docs/reference/api.md",
        "The read models of a store on PostgreSQL are kept in the same database, beside the "
        "events: `follow_projections=True` needs no `views=` there",
    )
    monkeypatch.syspath_prepend(str(project))
    from agents import calc  # type: ignore[import-not-found]

    async def run() -> list[str]:
        with trio.fail_after(60):
            async with Runtime(postgres_url, follow_projections=True) as runtime:
                await runtime.run(calc, "add 2 and 3", invocation_id="followed")
                runner = runtime.projections
                assert runner is not None
                await trio.to_thread.run_sync(runner.catch_up)
                return [row["invocation_id"] for row in list_invocations(runner)]

    assert trio.run(run) == ["followed"]
    assert READ_MODEL_TABLES | {"read_model_tracking"} <= tables(postgres_url)


def test_open_runner_on_a_postgresql_store_opens_its_own_database(
    postgres_url: str, project: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    says("docs/reference/api.md", "a store on PostgreSQL keeps them in its own database")
    ran = run_in_process(
        "run", "agents:calc", "--goal", "add", "--id", "opened",
        cwd=project, capsys=capsys, monkeypatch=monkeypatch, db=postgres_url,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    store = EventStore(postgres_url, create=False)
    try:
        runner = open_runner(store)
        try:
            runner.catch_up()
            assert [row["invocation_id"] for row in list_invocations(runner)] == ["opened"]
        finally:
            runner.close()
    finally:
        store.close()
    assert tables(postgres_url) >= READ_MODEL_TABLES


READ_COMMANDS = [
    ["show", "cli-1"],
    ["list"],
    ["metrics"],
    ["effects"],
    ["projections", "status"],
    ["projections", "catch-up"],
    ["projections", "rebuild"],
]


def test_the_read_model_commands_work_on_postgresql_without_views(
    postgres_url: str, project: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    says(
        "docs/reference/cli.md",
        "A PostgreSQL store keeps its read models in its own database, beside the events",
    )
    says(
        "docs/how-to/move-to-postgresql.md",
        "`show`, `list`, `metrics`, `effects` and `projections` catch them up there",
    )
    ran = run_in_process(
        "run", "agents:calc", "--goal", "add", "--id", "cli-1",
        cwd=project, capsys=capsys, monkeypatch=monkeypatch, db=postgres_url,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    for command in READ_COMMANDS:
        result = run_in_process(
            *command, cwd=project, capsys=capsys, monkeypatch=monkeypatch, db=postgres_url
        )
        assert result.returncode == 0, (command, result.stderr)
    status = run_in_process(
        "projections", "status", "--json",
        cwd=project, capsys=capsys, monkeypatch=monkeypatch, db=postgres_url,
    )  # fmt: skip
    assert {json.loads(line)["lag"] for line in status.stdout.splitlines()} == {0}
    assert tables(postgres_url) >= READ_MODEL_TABLES
    assert not list(project.glob("*.views.db"))


def test_views_puts_them_in_a_sqlite_file_or_another_postgresql_database(
    postgres_url: str, other_database: str, project: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    says("docs/reference/cli.md", "`--views FILE` puts them in a SQLite file instead.")
    says(
        "docs/reference/read-models.md",
        "that file (its folder must exist), or that PostgreSQL database (a `postgresql://` URL)",
    )
    ran = run_in_process(
        "run", "agents:calc", "--goal", "add", "--id", "elsewhere",
        cwd=project, capsys=capsys, monkeypatch=monkeypatch, db=postgres_url,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    for views in (str(project / "read.views.db"), other_database):
        listed = run_in_process(
            "list", "--json", "--views", views,
            cwd=project, capsys=capsys, monkeypatch=monkeypatch, db=postgres_url,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert [json.loads(line)["invocation_id"] for line in listed.stdout.splitlines()] == [
            "elsewhere"
        ]
    assert (project / "read.views.db").exists()
    assert tables(other_database) >= READ_MODEL_TABLES
    assert not READ_MODEL_TABLES & tables(postgres_url)


def test_after_a_move_the_first_command_builds_them_from_the_copied_events(
    postgres_url: str, project: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    says(
        "docs/how-to/move-to-postgresql.md",
        "Nothing moves with the events: the first command after the move builds them from "
        "the copied events.",
    )
    sqlite = f"sqlite:///{project / 'before.db'}"
    ran = run_in_process(
        "run", "agents:calc", "--goal", "add", "--id", "moved",
        cwd=project, capsys=capsys, monkeypatch=monkeypatch, db=sqlite,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    listed = run_in_process("list", cwd=project, capsys=capsys, monkeypatch=monkeypatch, db=sqlite)
    assert listed.returncode == 0, listed.stderr  # the SQLite store's read models, beside it
    copied = run_in_process(
        "store", "copy", "--from", sqlite, "--to", postgres_url,
        cwd=project, capsys=capsys, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert copied.returncode == 0, copied.stderr
    assert not READ_MODEL_TABLES & tables(postgres_url)
    listed = run_in_process(
        "list", "--json", cwd=project, capsys=capsys, monkeypatch=monkeypatch, db=postgres_url
    )
    assert [json.loads(line)["invocation_id"] for line in listed.stdout.splitlines()] == ["moved"]
