"""A database that goes away while a command runs is one line and exit 2, not an internal error.

Bad input tried: the store's read failing after it was opened, as a PostgreSQL server
stopped between the two does (``eventsourcing``'s ``OperationalError``). The whole
story, with a real server stopped mid-run: tests/scenarios/test_database_lost_mid_run.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import OperationalError

from loop_actors import EventStore
from tests.support.cli import run_in_process


def test_a_store_that_stops_answering_after_it_opened_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    ran = run_in_process("demo", cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db=db)
    assert ran.returncode == 0, ran.stderr
    invocation_id = ran.stdout.split(" id=")[1].split()[0]

    def gone(self: EventStore, *args: Any, **kwargs: Any) -> Any:
        raise OperationalError(
            "no connection to PostgreSQL at db:5432/agents within 5 s (connect_timeout): "
            "is the server running?"
        )

    monkeypatch.setattr(EventStore, "events", gone)
    shown = run_in_process(
        "history", invocation_id, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db=db
    )
    assert shown.returncode == 2
    assert shown.stderr == (
        "loop-actors: error: the store cannot be used: OperationalError: no connection to "
        "PostgreSQL at db:5432/agents within 5 s (connect_timeout): is the server running?\n"
    )
