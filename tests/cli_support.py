"""Running the ``loop-actors`` CLI in a real subprocess, as a user's shell would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "loop_actors.cli.main"]
"""The command line that runs the CLI with this interpreter."""


def cli_env(**extra: str) -> dict[str, str]:
    """This process's environment without loop-actors' own variables, plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("LOOP_ACTORS_DB", "LOOP_ACTORS_CRASH_AT")
    }
    env.update(extra)
    return env


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
