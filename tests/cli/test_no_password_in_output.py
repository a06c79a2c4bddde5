"""No command prints a PostgreSQL password: every URL shown is ``user:***@host``.

Every command that takes ``--db`` (found by walking the parser, so a new one must be
added here) runs against a PostgreSQL store whose URL carries the test server's
password, and neither its output nor its errors hold ``:<password>@``; the worker,
which runs until stopped, is started in a subprocess, its start-up line read, then
SIGTERMed. Bad inputs tried: a database that does not exist (every command's error),
a URL option that is not known, a password holding ``@`` and ``:``.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from loop_actors.cli.parser import build_parser
from loop_actors.store.url import redacted_url
from tests.support.cli import CLI, cli_env, run_in_process

AGENTS = '''
from loop_actors import Agent, ScriptedModel, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(effect="write", requires_approval=True)
def refund(order_id: str) -> str:
    """Refund an order (a person approves it first)."""
    return f"refunded {order_id}"


def _adding(request):
    if request.step == 1:
        return {"kind": "tool_calls", "calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}]}
    return {"kind": "final", "answer": "5"}


def _refunding(request):
    if request.step == 1:
        return {"kind": "tool_calls", "calls": [{"id": "r1", "name": "refund", "arguments": {"order_id": "A-1"}}]}
    return {"kind": "final", "answer": "done"}


calc = Agent("calc", ScriptedModel(_adding), tools=[add])
refunds = Agent("refunds", ScriptedModel(_refunding), tools=[refund])
'''

CASES = {
    "name": "pw",
    "agent": "agents:calc",
    "cases": [
        {
            "id": "adds",
            "goal": "add 2 and 3",
            "model": [{"kind": "final", "answer": "5"}],
            "expect": {"reason": "completed"},
        }
    ],
}


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], set[str]]]:
    """Every command (its words) and the options of it that take a database URL."""
    parser.format_help()  # the options of a command are added when it is first used
    options = {
        option
        for action in parser._actions
        for option in action.option_strings
        if option in ("--db", "--from", "--to", "--views")
    }
    if options:
        yield path, options
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_every_command_that_takes_a_database_url_is_tried_here() -> None:
    assert {path for path, _ in _commands(build_parser())} == {
        *ARGUMENTS,
        ("worker",),
        ("serve",),
        ("store", "copy"),
    }


ARGUMENTS: dict[tuple[str, ...], list[str]] = {
    ("demo",): [],
    ("run",): ["agents:calc", "--goal", "add", "--id", "done-1"],
    ("resume",): ["done-1", "--agent", "agents:calc"],
    ("approve",): ["refund-1", "--digest", "0" * 64, "--by", "alice"],
    ("deny",): ["refund-1", "--by", "bob", "--reason", "no receipt"],
    ("clarify",): ["done-1", "--answer", "A-1"],
    ("cancel",): ["refund-1", "--by", "bob"],
    ("reconcile",): ["--agent", "agents:refunds"],
    ("audit", "verify"): [],
    ("audit", "checkpoint"): ["--out", "note.txt"],
    ("show",): ["done-1"],
    ("list",): [],
    ("metrics",): [],
    ("effects",): [],
    ("effects", "list"): ["--json"],
    ("effects", "resolve"): ["eff-" + "0" * 40, "--committed", "--by", "alice"],
    ("projections", "status"): [],
    ("projections", "catch-up"): [],
    ("projections", "rebuild"): [],
    ("eval",): ["cases.json", "--json", "report.json"],
    ("submit",): ["agents:calc", "--goal", "queued", "--id", "queued-1"],
    ("workers",): [],
    ("schedule", "add"): ["nightly", "--agent", "agents:calc", "--goal", "add", "--every", "24h"],
    ("schedule", "list"): [],
    ("schedule", "pause"): ["nightly"],
    ("schedule", "resume"): ["nightly"],
    ("schedule", "remove"): ["nightly"],
    ("history",): ["done-1"],
    ("replay",): ["done-1", "--agent", "agents:calc"],
    ("fork",): ["done-1", "--at-step", "0", "--by", "ops", "--reason", "try", "--no-run"],
    ("watch",): ["done-1"],
    ("wake",): ["done-1"],  # refused: it does not sleep
    ("export",): ["done-1", "--html", "done-1.html"],
    ("trace", "export"): ["done-1", "--otlp", "http://127.0.0.1:9/"],  # nothing listens
}
"""Each command's arguments: the store holds ``done-1`` (completed) and ``refund-1`` (paused)."""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "agents.py").write_text(AGENTS)
    (tmp_path / "cases.json").write_text(json.dumps(CASES))
    return tmp_path


def _password(url: str) -> str:
    password = urlsplit(url).password
    assert password, f"the test server's URL has no password: {redacted_url(url)}"
    return password


def _leaks(url: str, text: str) -> bool:
    return f":{_password(url)}@" in text


def _run(
    project: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    path: tuple[str, ...],
    url: str,
) -> str:
    result = run_in_process(
        *path, *ARGUMENTS[path], cwd=project, capsys=capsys, monkeypatch=monkeypatch, db=url
    )
    return result.stdout + result.stderr


def _until_sigterm(project: Path, args: list[str], started: str) -> tuple[str, str]:
    """A long-running command's first output up to ``started``, then the rest once SIGTERMed.

    The command's start-up lines are read from stderr and stdout alike; it must exit 0.
    """
    process = subprocess.Popen(
        [*CLI, *args],
        cwd=project,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stderr is not None
        deadline = time.monotonic() + 60
        first = ""
        while started not in first and time.monotonic() < deadline:
            ready, _, _ = select.select([process.stderr, process.stdout], [], [], 1.0)
            for stream in ready:
                first += stream.readline()
        assert started in first, first
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    return first, out + err


def _worker_output(project: Path, url: str, *extra: str) -> tuple[str, str]:
    """A worker's start-up line, then everything it printed once SIGTERMed."""
    args = ["worker", "--agent", "agents:calc", *extra, "--db", url]
    return _until_sigterm(project, args, "serving calc")


def _serve_output(project: Path, url: str) -> str:
    """What ``serve`` printed from its start until SIGTERMed."""
    first, rest = _until_sigterm(
        project, ["serve", "--port", "0", "--db", url], "console on http://127.0.0.1:"
    )
    return first + rest


def test_no_command_prints_the_password_of_a_postgresql_url(
    postgres_url: str,
    project: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown = redacted_url(postgres_url)
    assert shown != postgres_url
    paused = run_in_process(
        "run", "agents:refunds", "--goal", "refund A-1", "--id", "refund-1",
        cwd=project, capsys=capsys, monkeypatch=monkeypatch, db=postgres_url,
    )  # fmt: skip
    assert paused.returncode == 3, paused.stderr  # approval_required: the store has refund-1
    printed = {path: _run(project, capsys, monkeypatch, path, postgres_url) for path in ARGUMENTS}
    printed["store", "copy"] = "\n".join(
        run_in_process(
            "store", "copy", *direction, cwd=project, capsys=capsys, monkeypatch=monkeypatch
        ).stdout
        for direction in (
            ["--from", postgres_url, "--to", f"sqlite:///{project / 'copy.db'}"],
            ["--from", postgres_url, "--to", postgres_url, "--json"],  # refused: not empty
        )
    )
    started, stopped = _worker_output(project, postgres_url)
    printed["worker",] = started + stopped
    printed["worker", "--json"] = "".join(_worker_output(project, postgres_url, "--json"))
    printed["serve",] = _serve_output(project, postgres_url)

    assert [path for path, text in printed.items() if _leaks(postgres_url, text)] == []
    # The URL is shown, without its password, where a command names its store.
    assert started.rstrip().endswith(f"on {shown}")
    assert f"--db {shown}" in printed["demo",]
    assert "done-1" in printed["list",]
    assert "refund-1" in printed["list",]


def test_no_error_prints_the_password_of_a_postgresql_url(
    postgres_url: str,
    project: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A database that does not exist, and an unknown URL option: every command's error."""
    parts = urlsplit(postgres_url)
    missing = urlunsplit(parts._replace(path="/no_such_database_here"))
    unknown_option = f"{postgres_url}?no_such_option=1"
    for url in (missing, unknown_option):
        printed = {path: _run(project, capsys, monkeypatch, path, url) for path in ARGUMENTS}
        assert [path for path, text in printed.items() if _leaks(url, text)] == []
        assert "no_such_database_here" in printed["list",] or "no_such_option" in printed["list",]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:secret@db:5432/agents", "postgresql://app:***@db:5432/agents"),
        ("postgresql://app:p@ss:w@db/agents", "postgresql://app:***@db/agents"),
        ("postgres://app:s3cret@db/agents?mode=ro", "postgres://app:***@db/agents?mode=ro"),
        ("postgresql://app@db:5432/agents", "postgresql://app@db:5432/agents"),
        ("sqlite:///loop-actors.db", "sqlite:///loop-actors.db"),
        (
            "copied from postgresql://a:one@h/x to postgresql://b:two@h/y",
            "copied from postgresql://a:***@h/x to postgresql://b:***@h/y",
        ),
    ],
)
def test_a_shown_url_keeps_everything_but_the_password(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
