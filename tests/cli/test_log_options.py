"""``--log-format json|text`` and ``--log-level LEVEL``: what the CLI writes to stderr.

Bad inputs tried: ``--log-format bogus``, ``--log-level loud``, ``$LOOP_ACTORS_LOG_FORMAT``
and ``$LOOP_ACTORS_LOG_LEVEL`` holding no format or level: each exit 2 with one line
naming the option, nothing run.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from loop_actors._logs import LOG_LEVELS, LogFormat
from loop_actors.cli.parser import LOG_FORMATS
from loop_actors.cli.parser import LOG_LEVELS as CLI_LOG_LEVELS
from tests.support.cli import run_in_process

Cli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``loop-actors ARGS --db DB`` in this process, in ``tmp_path``, on a store there."""
    db = f"sqlite:///{tmp_path / 'store.db'}"

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run_in_process(
            *args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db=db, env=env
        )

    return run


@pytest.mark.parametrize(
    "case",
    [
        (["--log-format", "bogus", "demo"], {}, "argument --log-format: invalid choice: 'bogus'"),
        (["demo", "--log-format", "xml"], {}, "argument --log-format: invalid choice: 'xml'"),
        (["--log-level", "loud", "demo"], {}, "argument --log-level: expected one of debug"),
        (["audit", "verify", "--log-level", "0"], {}, "argument --log-level: expected one of"),
        (["demo"], {"LOOP_ACTORS_LOG_FORMAT": "xml"}, "$LOOP_ACTORS_LOG_FORMAT must be one of"),
        (["demo"], {"LOOP_ACTORS_LOG_LEVEL": "chatty"}, "$LOOP_ACTORS_LOG_LEVEL must be one of"),
    ],
)
def test_a_bad_log_option_is_exit_2_with_one_line_and_nothing_runs(
    case: tuple[list[str], dict[str, str], str], cli: Cli, tmp_path: Path
) -> None:
    args, env, named = case
    refused = cli(*args, env=env)
    assert refused.returncode == 2
    assert named in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert refused.stdout == ""
    assert not (tmp_path / "store.db").exists()


@pytest.mark.parametrize("where", ["before the command", "after the command"])
def test_json_logs_are_one_object_a_line_with_the_runs_fields(where: str, cli: Cli) -> None:
    options = ["--log-format", "json", "--log-level", "INFO"]
    args = [*options, "demo"] if where == "before the command" else ["demo", *options]
    ran = cli(*args)
    assert ran.returncode == 0, ran.stderr
    records = [json.loads(line) for line in ran.stderr.splitlines()]
    assert {"time", "level", "logger", "message"} <= set(records[0])
    (ended,) = [r for r in records if r.get("reason")]
    assert ended["level"] == "info"
    assert ended["logger"] == "loop_actors.runtime"
    assert (ended["reason"], ended["outcome"], ended["agent"]) == ("completed", "ended", "demo")
    assert ended["invocation_id"] in ran.stdout
    assert all(r["level"] != "debug" for r in records)


def test_a_sub_command_takes_the_log_options_after_its_name_too(cli: Cli) -> None:
    ran = cli("demo")
    assert ran.returncode == 0
    verified = cli("audit", "verify", "--no-state", "--log-format", "json", "--log-level", "error")
    assert verified.returncode == 0, verified.stderr
    assert verified.stderr == ""


def test_text_logs_show_the_message_then_level_logger_and_fields(cli: Cli) -> None:
    ran = cli("--log-level", "debug", "demo")
    assert ran.returncode == 0, ran.stderr
    (ended,) = [line for line in ran.stderr.splitlines() if " ended: " in line]
    assert ended.startswith("invocation ")
    assert ended.endswith(" outcome=ended reason=completed agent=demo]")
    assert " [info loop_actors.runtime invocation_id=" in ended
    assert any(line.startswith("lease of ") for line in ran.stderr.splitlines())


def test_by_default_a_run_that_goes_well_prints_nothing_on_stderr(cli: Cli) -> None:
    """Warnings and above only: lifecycle records (info) are not shown."""
    ran = cli("demo")
    assert ran.returncode == 0
    assert ran.stderr == ""


def test_the_cli_takes_its_handler_off_when_it_returns(cli: Cli) -> None:
    """Run in-process (a test, a script), it leaves logging as it found it."""
    root = logging.getLogger("loop_actors")
    before = (list(root.handlers), root.level)
    ran = cli("--log-level", "debug", "demo")
    assert ran.returncode == 0
    assert (list(root.handlers), root.level) == before


def test_the_options_choices_are_the_formatters() -> None:
    """The parser writes them out (it imports nothing heavy); they agree with the logs module."""
    assert tuple(LogFormat) == LOG_FORMATS
    assert CLI_LOG_LEVELS == LOG_LEVELS
