from __future__ import annotations

from pathlib import Path

import pytest
import trio.testing


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A fresh SQLite file for one test."""
    return f"sqlite:///{tmp_path / 'test.db'}"


@pytest.fixture
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    """Virtual time that jumps ahead only when the run has been idle for 50 ms of real time.

    Commits run on the Journal's writer thread; a zero threshold would let the
    clock jump while a commit is in flight.
    """
    mock_clock.autojump_threshold = 0.05
    return mock_clock
