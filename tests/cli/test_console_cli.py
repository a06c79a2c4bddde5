"""``loop-actors serve`` refusals and ``loop-actors watch``, as a user's shell runs them.

Bad inputs tried: ``--host 0.0.0.0`` without a token, a token too short, ``--port``
out of range and not a number, a port already in use, a store that does not exist,
``--agent`` that is no agent, two agents of one name, ``--forwarded-allow-ips`` without
a token and with ``*``, ``watch`` of an unknown invocation and ``--from -1``.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import pytest

from loop_actors.cli.options import console as console_options
from loop_actors.console import settings
from loop_actors.store.store import EventStore
from tests.support.cli import CLI, cli_env, run_cli, run_in_process
from tests.support.console import TOKEN, completed_refund

ROOT = Path(__file__).resolve().parents[2]


def test_the_options_defaults_are_the_consoles() -> None:
    assert console_options.DEFAULT_HOST == settings.DEFAULT_HOST
    assert console_options.DEFAULT_PORT == settings.DEFAULT_PORT


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--host", "0.0.0.0"], "without a token"),  # noqa: S104 - refused
        (["--host", "192.0.2.1"], "without a token"),
        (["--token", "short"], "at least 16 characters"),
        (["--port", "70000"], "a port is 0..65535"),
        (["--port", "eighty"], "expected a port number"),
        (["--forwarded-allow-ips", "127.0.0.1"], "behind a proxy"),
        (["--token", TOKEN, "--forwarded-allow-ips", "*"], "addresses or networks"),
        (["--token", TOKEN, "--agent", "tests.support.console:nothing"], "no attribute"),
        (["--token", TOKEN, "--agent", "tests.support.console:TOKEN"], "not a loop_actors.Agent"),
        (
            ["--token", TOKEN, "--agent", "tests.support.console:refunds"] * 2,
            "two agents are named 'refunds'",
        ),
    ],
)
def test_serve_refuses_what_is_unsafe_or_malformed(
    args: list[str],
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = run_in_process(
        "serve", *args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db="memory://"
    )
    assert result.returncode == 2
    assert says in result.stderr
    assert result.stdout == ""


def test_serve_refuses_a_store_that_does_not_exist(tmp_path: Path) -> None:
    result = run_cli(
        "serve", "--token", TOKEN, cwd=tmp_path, db=f"sqlite:///{tmp_path / 'typo.db'}"
    )
    assert result.returncode == 2
    assert "typo.db" in result.stderr
    assert not (tmp_path / "typo.db").exists()


def test_serve_on_a_port_in_use_is_a_usage_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "serve", "--port", str(port), "--token", TOKEN, cwd=tmp_path, db="memory://"
        )
    assert result.returncode == 2, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


async def test_watch_prints_what_history_prints(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'w.db'}"
    await completed_refund(db, "done")
    history = run_cli("history", "done", "--json", cwd=tmp_path, db=db)
    watched = run_cli("watch", "done", "--json", cwd=tmp_path, db=db)
    later = run_cli("watch", "done", "--from", "6", cwd=tmp_path, db=db)
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout == history.stdout
    assert [line.split()[0] for line in later.stdout.splitlines()] == ["7", "8"]
    assert "Terminated" in later.stdout.splitlines()[-1]


async def test_watch_refuses_an_unknown_invocation_and_a_negative_start(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'w.db'}"
    await completed_refund(db, "done")
    unknown = run_cli("watch", "nobody", cwd=tmp_path, db=db)
    negative = run_cli("watch", "done", "--from", "-1", cwd=tmp_path, db=db)
    assert unknown.returncode == 2
    assert "nobody" in unknown.stderr
    assert negative.returncode == 2
    assert "--from must be at least 0" in negative.stderr


def test_serve_names_its_agents_and_ignores_a_token_in_the_tests_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``$LOOP_ACTORS_CONSOLE_TOKEN`` where the tests run does not reach the command."""
    monkeypatch.setenv(settings.TOKEN_ENV, "a-token-of-the-developers-shell")
    db = f"sqlite:///{tmp_path / 'served.db'}"
    EventStore(db).close()
    argv = [*CLI, "serve", "--port", "0", "--agent", "tests.support.console:refunds"]
    server = subprocess.Popen(
        [*argv, "--db", db],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    lines = [server.stdout.readline() for _ in range(3)]
    server.send_signal(signal.SIGTERM)
    _, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert lines[0].startswith("loop-actors console on http://127.0.0.1:")
    assert lines[1].startswith("token (decisions need it): ")  # generated: none was given
    assert lines[2] == "agents (bulk resume and reconcile run here): refunds\n"
