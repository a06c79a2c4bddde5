"""A model that answers ``ModelReply(proposal=None)`` is rejected, and the store stays readable.

Issue 33, item A: the rejected proposal used to be stored without ``rejection.raw``
(nulls are left out of a stored event, and the field was required), so the event
could not be read back: the run itself, ``history``, ``resume`` and ``audit verify``
failed, and the read models stopped at that row for every invocation of the store.

Bad inputs tried: a ``None`` proposal from a model of the user's own (a ``Model``
whose ``decide`` returns ``ModelReply(proposal=None)``), and the same from a
``ScriptedModel`` whose script function returns ``None``; in a store that also holds
an ordinary invocation, which the read models must still answer for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.decisions import RejectionClass
from aggregates.invocation import DecisionProposed
from loop_actors import (
    Agent,
    ModelReply,
    ModelRequest,
    Runtime,
    ScriptedModel,
    TerminalReason,
)
from loop_actors.audit.verify import verify_all
from loop_actors.store.store import EventStore
from tests.support.cli import run_in_process


class NoneThenClarify:
    """Answers ``None`` at step 1, then asks a question (the run pauses)."""

    async def decide(self, request: ModelRequest) -> ModelReply:
        if request.step == 1:
            return ModelReply(proposal=None)
        if request.step == 2:
            return ModelReply(proposal={"kind": "clarification", "question": "which?"})
        return ModelReply(proposal={"kind": "final", "answer": "done"})


def _script(request: ModelRequest) -> Any:
    return None if request.step == 1 else {"kind": "final", "answer": "done"}


async def test_a_none_proposal_is_rejected_and_its_invocation_reads_resumes_and_verifies(
    db_url: str,
) -> None:
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            paused = await runtime.run(
                Agent("none", NoneThenClarify(), []), "goal", invocation_id="n"
            )
            assert paused.reason is TerminalReason.CLARIFICATION_REQUIRED
            history = await runtime.history("n")
        rejected = [e for e in history if isinstance(e, DecisionProposed) and e.rejection]
        assert len(rejected) == 1
        assert rejected[0].rejection is not None
        assert rejected[0].rejection.rejection_class is RejectionClass.SCHEMA_INVALID
        assert rejected[0].rejection.raw is None
        # A new Runtime reads it from the store, and goes on from it.
        async with Runtime(db_url) as reopened:
            assert await reopened.history("n") == history
            await reopened.clarify("n", answer="this one")
            ended = await reopened.resume("n", Agent("none", NoneThenClarify(), []))
    assert ended.reason is TerminalReason.COMPLETED
    store = EventStore(db_url, create=False)
    try:
        reports, _ = verify_all(store)
    finally:
        store.close()
    assert reports
    assert all(report.intact for report in reports)


async def test_a_scripted_none_proposal_leaves_every_read_model_and_command_working(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'events.db'}"
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            plain = await runtime.run(
                Agent("plain", ScriptedModel([{"kind": "final", "answer": "hi"}]), []),
                "goal",
                invocation_id="plain",
            )
            odd = await runtime.run(
                Agent("odd", ScriptedModel(_script), []), "goal", invocation_id="odd"
            )
    assert plain.reason is TerminalReason.COMPLETED
    assert odd.reason is TerminalReason.COMPLETED
    for command in (
        ["history", "odd", "--json"],
        ["show", "odd"],
        ["show", "plain"],
        ["list"],
        ["metrics"],
        ["effects"],
        ["audit", "verify"],
    ):
        done = run_in_process(*command, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db=db)
        assert done.returncode == 0, (command, done.stderr)
        assert "Traceback" not in done.stderr, command
    listed = run_in_process(
        "list", "--json", cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db=db
    )
    rows = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    assert {row["invocation_id"] for row in rows} >= {"plain", "odd"}
