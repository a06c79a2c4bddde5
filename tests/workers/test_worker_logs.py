"""What a worker logs of a claimed run it cannot drive: the error's class, never its message.

Bad input tried: a claimed run whose history was cut by hand behind the effect ledger's
back (its refusal names the write's raw effect key, which goes to the row's note for a
person, and into no log record at DEBUG, as text or JSON).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from loop_actors import Agent, JsonLogFormatter, TextLogFormatter, Worker
from tests.support.cut_history import CHARGES, charge, cut_from, first_position, run_once, scripted
from tests.support.workers import queue_row


def test_a_claimed_run_stopped_by_a_cut_history_is_logged_by_class_without_its_effect_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "events.db"
    CHARGES.clear()
    run_once(db)  # "p" charges twice and completes
    keys = [key for key in CHARGES if key is not None]
    assert len(keys) == 2
    cut_from(db, "p", first_position(db, "p", "DecisionProposed", 2))
    with sqlite3.connect(db) as connection:  # its row made runnable again
        connection.execute(
            "UPDATE loop_actors_queue SET status = 'runnable', holder = NULL "
            "WHERE invocation_id = 'p'"
        )
    payer = Agent("payer", scripted("other-"), [charge])
    caplog.set_level(logging.DEBUG, logger="loop_actors")

    async def work() -> Any:
        with trio.fail_after(30):
            worker = Worker(payer, f"sqlite:///{db}", poll_s=0.05)
            report = await worker.run(until_idle=True)
            return report, await queue_row(f"sqlite:///{db}", "p")

    report, row = trio.run(work)
    assert report.failed == 1
    assert any(key in (row.note or "") for key in keys)  # the person's note names it
    (stopped,) = [r for r in caplog.records if getattr(r, "loop", None) == "drives"]
    assert stopped.levelno == logging.WARNING
    assert stopped.exc_info is None
    assert stopped.error_type == "InconsistentHistoryError"  # type: ignore[attr-defined]
    assert stopped.invocation_id == "p"  # type: ignore[attr-defined]
    text, json_ = TextLogFormatter(), JsonLogFormatter()
    shown = "\n".join(f"{text.format(r)}\n{json_.format(r)}" for r in caplog.records)
    assert [key for key in keys if key in shown] == []
