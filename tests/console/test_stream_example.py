"""``docs/examples/follow_stream.py`` against a real ``loop-actors serve``: every event once.

Its first connection is dropped after three events; it connects again with
``Last-Event-ID`` and gets the rest, each once, up to ``Terminated``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.support.cli import CLI, cli_env
from tests.support.console import TOKEN, completed_refund

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "follow_stream.py"


def test_the_stream_example_gets_every_event_once_after_a_drop(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'stream.db'}"
    trio.run(completed_refund, db, "done")
    server = subprocess.Popen(
        [*CLI, "serve", "--port", "0", "--token", TOKEN, "--db", db],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        base = server.stdout.readline().split(" on ", 1)[1].strip()
        example = subprocess.run(
            [sys.executable, str(EXAMPLE), base, "done", "--drop-after", "3"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=20)
    assert server.returncode == 0
    assert example.returncode == 0, example.stderr
    lines = example.stdout.splitlines()
    assert lines == [
        "  1 InvocationStarted",
        "  2 DecisionProposed",
        "  3 Paused",
        "connection lost (dropped on purpose); again from Last-Event-ID 3",
        "  4 ApprovalGranted",
        "  5 BatchDispatched",
        "  6 ResultsCommitted",
        "  7 DecisionProposed",
        "  8 Terminated",
        "8 events, each once; it ended completed",
    ]
