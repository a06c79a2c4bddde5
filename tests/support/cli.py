"""Running the ``loop-actors`` CLI in a real subprocess, as a user's shell would, or in-process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loop_actors.cli import main

CLI = [sys.executable, "-m", "loop_actors.cli.main"]
"""The command line that runs the CLI with this interpreter."""

SUPPORT = Path(__file__).parent


def sleepers_folder(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``folder`` holding ``sleepers_app.py``, whose tool notes its calls in ``calls.log`` there."""
    shutil.copy(SUPPORT / "sleepers_app.py", folder / "sleepers_app.py")
    monkeypatch.setenv("SLEEPERS_LOG", str(folder / "calls.log"))
    return folder


HARNESS_VARIABLES = ("LOOP_ACTORS_TEST_", "LOOP_ACTORS_REQUIRE_", "LOOP_ACTORS_PG_")
"""The test harness's own ``LOOP_ACTORS_*`` variables (the tests' PostgreSQL server, what
CI requires), which loop-actors never reads: a command run by a test keeps them."""


def is_loop_actors_variable(name: str) -> bool:
    """Whether ``name`` is one of loop-actors' own variables (``$LOOP_ACTORS_DB``,
    ``$LOOP_ACTORS_CONSOLE_TOKEN``, ``$LOOP_ACTORS_CHECKPOINT_DIR``...), not the harness's."""
    return name.startswith("LOOP_ACTORS_") and not name.startswith(HARNESS_VARIABLES)


def cli_env(**extra: str) -> dict[str, str]:
    """This process's environment without loop-actors' own variables, plus ``extra``.

    Every one is left out, not a list of them: a variable set where the tests run
    (``$LOOP_ACTORS_CONSOLE_TOKEN`` in a developer's shell) would otherwise change what
    a command does (``serve`` would print no generated token, start beyond loopback).
    """
    env = {k: v for k, v in os.environ.items() if not is_loop_actors_variable(k)}
    env.update(extra)
    return env


def kill_all(processes: list[subprocess.Popen[str]]) -> None:
    """SIGKILL those of ``processes`` still running, and reap every one (a test's clean-up)."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def run_cli(
    *args: str,
    cwd: Path,
    db: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``loop-actors ARGS [--db DB]`` in ``cwd`` and capture its output (never raises)."""
    return subprocess.run(
        [*CLI, *args, *(["--db", db] if db is not None else [])],
        cwd=cwd,
        env=cli_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_in_process(
    *args: str,
    cwd: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    db: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``run_cli``'s result, from ``main(argv)`` in this process: no interpreter to start.

    For the commands that end on their own (usage errors, short runs). Like a new
    process, it runs in ``cwd`` without loop-actors' own variables, and forgets the
    modules it imported from ``cwd`` (each test's ``agents.py`` is its own).
    """
    argv = [*args, *(["--db", db] if db is not None else [])]
    for name in [name for name in os.environ if is_loop_actors_variable(name)]:
        monkeypatch.delenv(name)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    before, path, here = set(sys.modules), list(sys.path), Path.cwd()
    capsys.readouterr()  # what the test printed before is not the command's
    os.chdir(cwd)
    try:
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse: --help, --version, a usage error
            code = exit_.code if isinstance(exit_.code, int) else 0
    finally:
        os.chdir(here)
        sys.path[:] = path
        for name in set(sys.modules) - before:
            file = getattr(sys.modules[name], "__file__", None) or ""
            if Path(file).is_relative_to(cwd):
                del sys.modules[name]
    output = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, output.out, output.err)
