"""Bad input is refused, typed, before anything is written (issue 13's small items).

Each test drives the CLI (in-process with ``main(argv)``, or as a real subprocess where
the process itself matters) or the public API, on real SQLite files, and says in its
docstring which bad inputs it tries.
"""

from __future__ import annotations

import importlib.metadata
import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.effect import effect_key
from aggregates.errors import IllegalTransitionError
from aggregates.invocation import Invocation
from loop_actors import (
    Agent,
    Budget,
    CancelResult,
    EventStore,
    InvocationExistsError,
    Runtime,
    ScriptedModel,
    StoreCipherError,
    StoreUnavailableError,
    StoreUrlError,
    TerminalReason,
    Tool,
    UsageError,
    tool,
)
from tests.support.cli import CLI, cli_env, run_cli, run_in_process
from tests.support.project_agents import AGENTS

pytestmark = pytest.mark.slow


@pytest.fixture
def run_main(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_cli`` in this process: ``main(argv)``, its output captured."""
    return partial(run_in_process, capsys=capsys, monkeypatch=monkeypatch)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "agents.py").write_text(AGENTS)
    return tmp_path


def _rows(db: Path) -> list[tuple[str, int]]:
    with closing(sqlite3.connect(db)) as connection:
        return connection.execute(
            "SELECT originator_id, originator_version FROM stored_events ORDER BY rowid"
        ).fetchall()


@tool
def lookup(key: str) -> dict[str, str]:
    """Look up a key."""
    return {"key": key}


ASKING = Agent("asking", ScriptedModel([{"kind": "clarification", "question": "Which one?"}]))


# --------------------------------------------------------------------------- invocation ids


@pytest.mark.parametrize(
    "invocation_id",
    ["cancel:order-1", "eff-0123456789abcdef0123456789abcdef01234567", "a\x1fb", "line\nbreak"],
)
async def test_run_refuses_an_id_in_an_internal_namespace_or_with_a_control_character(
    db_url: str, tmp_path: Path, invocation_id: str
) -> None:
    """Bad inputs: ``cancel:X`` (X's cancel slot), an effect key, ``\\x1f``, a newline."""
    with trio.fail_after(30):
        with pytest.raises(UsageError, match="invocation id"):
            await Runtime(db_url).run(ASKING, "g", invocation_id=invocation_id)
    assert not (tmp_path / "test.db").exists()  # refused before the store was opened


def test_cli_refuses_run_id_cancel_x_and_cancel_x_then_ends_x(
    project: Path, run_main: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """Bad input: ``run --id cancel:ask-1``; ``cancel ask-1`` afterwards records and ends it."""
    paused = run_main("run", "agents:asking", "--goal", "g", "--id", "ask-1", cwd=project)
    assert paused.returncode == 3, paused.stderr
    taken = run_main("run", "agents:answering", "--goal", "g", "--id", "cancel:ask-1", cwd=project)
    assert taken.returncode == 2
    assert "starts with 'cancel:'" in taken.stderr
    assert [row[0] for row in _rows(project / "loop-actors.db")] == ["ask-1"] * 3
    cancelled = run_main("cancel", "ask-1", "--json", cwd=project)
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["result"] == "ended"
    request = run_main("history", "cancel:ask-1", cwd=project)
    assert "CancelRequested" in request.stdout


def test_an_invocation_id_with_the_key_separator_cannot_share_an_effect_key() -> None:
    """Bad inputs: ``x\\x1f1`` step 2 call ``c`` would join like ``x`` step 1 call ``2\\x1fc``."""
    assert effect_key("x", 1, "2\x1fc") != effect_key("x", 12, "c")
    with pytest.raises(ValueError, match="separator"):
        effect_key("x\x1f1", 2, "c")
    with pytest.raises(IllegalTransitionError, match="control character"):
        Invocation.start(
            invocation_id="x\x1f1",
            goal="g",
            agent_name="a",
            agent_version="1",
            catalogue_digest="d",
            tools=[],
            budget=Budget(),
            at=datetime(2026, 1, 1, tzinfo=UTC),
        )


# --------------------------------------------------------------------------- cancel requests


def _break_inserts(db: Path) -> None:
    """Every later insert fails with an OperationalError (not a conflict), like a broken disk."""
    with closing(sqlite3.connect(db)) as connection:
        connection.execute(
            "CREATE TRIGGER broken BEFORE INSERT ON stored_events "
            "BEGIN INSERT INTO no_such_table VALUES (1); END"
        )
        connection.commit()


async def test_request_cancel_raises_when_the_request_cannot_be_committed(
    db_url: str, tmp_path: Path
) -> None:
    """Bad input: a store that fails every insert; before, ``requested`` came back, nothing recorded."""
    with trio.fail_after(30):
        outcome = await Runtime(db_url).run(ASKING, "g", invocation_id="ask-1")
        assert outcome.reason is TerminalReason.CLARIFICATION_REQUIRED
        _break_inserts(tmp_path / "test.db")
        with pytest.raises(StoreUnavailableError, match="cannot record the cancel request"):
            await Runtime(db_url).request_cancel("ask-1", by="ops")
        invocation = await Runtime(db_url).load("ask-1")
    assert invocation.paused is not None  # still paused: nothing pretended otherwise
    assert [row[0] for row in _rows(tmp_path / "test.db")] == ["ask-1"] * 3


def test_cli_cancel_exits_2_when_the_request_cannot_be_committed(
    project: Path, run_main: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """Bad input: a store that fails every insert; ``cancel`` says so instead of ``requested``."""
    assert run_main("run", "agents:asking", "--goal", "g", "--id", "a", cwd=project).returncode == 3
    _break_inserts(project / "loop-actors.db")
    result = run_main("cancel", "a", cwd=project)
    assert result.returncode == 2
    assert "cannot record the cancel request of a" in result.stderr
    assert "requested" not in result.stdout


async def test_request_cancel_still_reports_a_recorded_request(db_url: str) -> None:
    """The fix leaves the happy path alone: a paused invocation ends, a second ask is a no-op."""
    with trio.fail_after(30):
        await Runtime(db_url).run(ASKING, "g", invocation_id="ask-1")
        assert await Runtime(db_url).request_cancel("ask-1") is CancelResult.ENDED
        assert await Runtime(db_url).request_cancel("ask-1") is CancelResult.ALREADY_ENDED


# --------------------------------------------------------------------------- encrypted stores


def _key() -> str:
    from eventsourcing.cipher import AESCipher

    return AESCipher.create_key(16)


CIPHER = "eventsourcing.cipher:AESCipher"
BLOCK_CRYPTO = "import sys; sys.modules['Crypto'] = None; "


def _cli_with(
    env: dict[str, str], *args: str, cwd: Path, prelude: str = ""
) -> subprocess.CompletedProcess[str]:
    code = prelude + "import sys; from loop_actors.cli import main; sys.exit(main(sys.argv[1:]))"
    base = {k: v for k, v in cli_env().items() if k not in ("CIPHER_TOPIC", "CIPHER_KEY")}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def encrypted(project: Path) -> dict[str, str]:
    env = {"CIPHER_TOPIC": CIPHER, "CIPHER_KEY": _key()}
    written = _cli_with(env, "run", "agents:answering", "--goal", "g", "--id", "e", cwd=project)
    assert written.returncode == 0, written.stderr
    return env


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing key", "CIPHER_KEY"),
        ("wrong key", "cannot decrypt"),
        ("no cipher", "are encrypted"),
        ("no crypto extra", "loop-actors[crypto]"),
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        ["history", "e"],
        ["list"],
        ["audit", "verify"],
        ["resume", "e", "--agent", "agents:answering"],
        ["run", "agents:answering", "--goal", "g2", "--id", "e2"],
    ],
    ids=lambda c: c[0],
)
def test_an_encrypted_store_without_its_key_is_a_clear_usage_error(
    project: Path, encrypted: dict[str, str], case: str, expected: str, command: list[str]
) -> None:
    """Bad inputs: no CIPHER_KEY, another key, no CIPHER_TOPIC, the crypto package missing."""
    env, prelude = {
        "missing key": ({"CIPHER_TOPIC": CIPHER}, ""),
        "wrong key": ({"CIPHER_TOPIC": CIPHER, "CIPHER_KEY": _key()}, ""),
        "no cipher": ({}, ""),
        "no crypto extra": (encrypted, BLOCK_CRYPTO),
    }[case]
    before = _rows(project / "loop-actors.db")
    result = _cli_with(env, *command, cwd=project, prelude=prelude)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("loop-actors: error: ")
    assert "internal error" not in result.stderr
    assert expected in result.stderr
    assert _rows(project / "loop-actors.db") == before  # nothing written


@pytest.mark.parametrize("first", [b"{", b"\x01", b"\x02"])
def test_a_ciphertext_that_starts_like_json_is_still_seen_as_encrypted(
    project: Path, encrypted: dict[str, str], first: bytes
) -> None:
    """Bad input: no cipher, and the first event's ciphertext happens to start with ``{``
    (or with the first byte of a packed row).

    One store in 256 is written so (the first byte of a random nonce); the check
    once looked at that byte alone, and the command then failed with an internal error.
    """
    db = project / "loop-actors.db"
    with closing(sqlite3.connect(db)) as connection, connection:
        rowid, state = connection.execute(
            "SELECT rowid, state FROM stored_events ORDER BY rowid LIMIT 1"
        ).fetchone()
        connection.execute(
            "UPDATE stored_events SET state = ? WHERE rowid = ?", (first + state[1:], rowid)
        )
    result = _cli_with({}, "history", "e", cwd=project)
    assert result.returncode == 2, result.stderr
    assert "are encrypted" in result.stderr
    assert "internal error" not in result.stderr


def test_an_encrypted_store_opens_with_its_key(project: Path, encrypted: dict[str, str]) -> None:
    """The right key still reads everything (the check does not refuse a good store)."""
    result = _cli_with(encrypted, "history", "e", cwd=project)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 6


def test_event_store_raises_store_cipher_error_for_a_wrong_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad input: another key, through the Python API (a ``StoreUnavailableError``)."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    monkeypatch.setenv("CIPHER_TOPIC", CIPHER)
    monkeypatch.setenv("CIPHER_KEY", _key())
    Runtime(url).run_sync(ASKING, "g", invocation_id="e")
    monkeypatch.setenv("CIPHER_KEY", _key())
    with pytest.raises(StoreCipherError, match="cannot decrypt"):
        EventStore(url)
    assert issubclass(StoreCipherError, StoreUnavailableError)


# --------------------------------------------------------------------------- models


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_model_whose_sdk_is_missing_is_refused_before_anything_is_written(
    project: Path, provider: str
) -> None:
    """Bad input: ``--model PROVIDER:m`` with the SDK's import blocked; before, ``model_error``."""
    result = _cli_with(
        {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-test"},
        "run", "agents:answering", "--goal", "g", "--model", f"{provider}:m",
        cwd=project,
        prelude=f"import sys; sys.modules[{provider!r}] = None; ",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"pip install 'loop-actors[{provider}]'" in result.stderr
    assert not (project / "loop-actors.db").exists()


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("url", ["sqlite:/x.db", "sqlite:x.db", "memory:", "memory://x"])
def test_a_database_url_without_its_slashes_is_refused(
    project: Path, url: str, run_main: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """Bad inputs: one slash, no slash (both used to open ``x.db``), memory URLs with more."""
    result = run_main("run", "agents:answering", "--goal", "g", "--db", url, cwd=project)
    assert result.returncode == 2
    assert "loop-actors: error:" in result.stderr
    assert not (project / "x.db").exists()
    with pytest.raises(StoreUrlError):
        Runtime(url)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reason", "bogus"], "invalid choice: 'bogus'"),
        (["--limit", "-1"], "must be at least 1"),
        (["--limit", "0"], "must be at least 1"),
        (["--limit", "many"], "expected a whole number"),
    ],
)
def test_list_refuses_an_unknown_reason_and_a_limit_below_one(
    project: Path,
    args: list[str],
    message: str,
    run_main: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """Bad inputs: a reason that is not a terminal reason, limits -1, 0 and a word."""
    assert run_main("run", "agents:answering", "--goal", "g", cwd=project).returncode == 0
    result = run_main("list", *args, cwd=project)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (project / "loop-actors.views.db").exists()  # refused before any read model


def test_list_accepts_a_terminal_reason_and_a_positive_limit(
    project: Path, run_main: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """The checks leave good values alone."""
    assert run_main("run", "agents:answering", "--goal", "g", cwd=project).returncode == 0
    result = run_main("list", "--reason", "completed", "--limit", "1", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["reason"] == "completed"


def _single_function(key: str) -> str:
    """Not wrapped."""
    return key


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        (lookup, "got the single Tool 'lookup'; write tools=[lookup]"),
        (_single_function, "got the single function '_single_function'"),
        ("lookup", "got a value of type str"),
        ({"lookup": lookup}, "got a value of type dict"),
        (42, "got a value of type int"),
        ([lookup, 3], "tools[1] is of type int"),
    ],
    ids=["tool", "function", "str", "dict", "int", "list-with-int"],
)
def test_agent_tools_must_be_a_list_of_tools(tools: Any, message: str) -> None:
    """Bad inputs: one Tool, one function, a str, a dict, a non-iterable, a non-callable item."""
    with pytest.raises(UsageError) as raised:
        Agent("a", ScriptedModel([]), tools=tools)
    assert message in str(raised.value)


def test_agent_tools_may_be_any_iterable_of_tools() -> None:
    """A tuple or a generator of tools and functions is still accepted."""
    listed: list[Tool | Callable[..., Any]] = [lookup, _single_function]
    agent = Agent("a", ScriptedModel([]), tools=(t for t in listed))
    assert sorted(agent.toolbox.tools) == ["_single_function", "lookup"]


def test_starting_an_id_that_has_not_stopped_and_nobody_drives_says_resume_it(
    project: Path,
) -> None:
    """Bad input: ``run --id X`` again while X never stopped (killed after its start)."""
    crashed = run_cli(
        "run", "agents:answering", "--goal", "g", "--id", "x",
        cwd=project,
        env={"LOOP_ACTORS_CRASH_AT": "after_start_commit"},
    )  # fmt: skip
    assert crashed.returncode < 0  # killed
    again = run_cli("run", "agents:answering", "--goal", "g", "--id", "x", cwd=project)
    assert again.returncode == 2
    assert "no process holds its lease: resume it" in again.stderr


async def test_run_of_an_id_another_runtime_is_driving_raises_invocation_exists(
    db_url: str,
) -> None:
    """Bad input: the same id started in a second runtime while the first is running it."""
    started = trio.Event()
    release = trio.Event()

    async def slow(request: Any) -> dict[str, Any]:
        started.set()
        await release.wait()
        return {"kind": "final", "answer": "done"}

    agent = Agent("slow", ScriptedModel(slow))
    first = Runtime(db_url)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: first.run(agent, "g", invocation_id="x"))
            await started.wait()  # its queue row was committed with its start
            # A LeaseHeldError, which is an InvocationExistsError naming the holder.
            with pytest.raises(InvocationExistsError, match="is being driven by run:"):
                await Runtime(db_url).run(agent, "g", invocation_id="x")
            release.set()


def test_version_prints_the_installed_version(tmp_path: Path) -> None:
    """``loop-actors --version`` (no command needed), exit 0."""
    result = subprocess.run(
        [*CLI, "--version"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"loop-actors {importlib.metadata.version('loop-actors')}"
