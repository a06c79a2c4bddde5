"""Resume refuses a store whose history was cut behind the effect ledger's back."""

from __future__ import annotations

import sqlite3
import textwrap
from pathlib import Path

import pytest
import trio

from loop_actors import Agent, InconsistentHistoryError, Runtime, TerminalReason
from loop_actors.store.sqlite_recorder import LeanSQLiteRecorder
from loop_actors.store.store import EventStore
from tests.support.audit import AGENT
from tests.support.cli import run_cli
from tests.support.cut_history import CHARGES, charge, cut_from, first_position, run_once, scripted


@pytest.mark.parametrize("cut_at", ["DecisionProposed", "BatchDispatched"])
@pytest.mark.parametrize("prefix", ["other-", "c"])
def test_a_resume_after_the_tail_was_cut_is_refused_and_charges_nothing(
    tmp_path: Path, prefix: str, cut_at: str
) -> None:
    """Bad input: a completed invocation whose rows from its second DecisionProposed (or its
    second BatchDispatched) on were deleted by hand. Asked again, a model with other call ids
    would charge a second time under a new effect key (without the check this test fails
    there), and a cut just after the decision crashed with an AggregateError. Each, with
    other call ids or the same ones, gets the typed refusal; nothing is written or run."""
    db = tmp_path / "events.db"
    CHARGES.clear()
    run_once(db)
    assert len(CHARGES) == 2
    cut_from(db, "p", first_position(db, "p", cut_at, 2))
    before = sqlite3.connect(db).execute("SELECT COUNT(*) FROM stored_events").fetchone()

    async def resume() -> None:
        with trio.fail_after(30):
            async with Runtime(f"sqlite:///{db}") as runtime:
                await runtime.resume("p", Agent("payer", scripted(prefix), [charge]))

    with pytest.raises(InconsistentHistoryError, match="audit verify") as raised:
        trio.run(resume)
    assert raised.value.invocation_id == "p"
    assert "history was cut" in str(raised.value)
    assert len(CHARGES) == 2  # no second charge
    after = sqlite3.connect(db).execute("SELECT COUNT(*) FROM stored_events").fetchone()
    assert after == before  # nothing recorded either


def test_a_resume_after_a_crash_between_dispatch_and_results_still_settles(tmp_path: Path) -> None:
    """Bad input: none (the legitimate case next to the refused one). Cutting only the rows
    after the second BatchDispatched is what a crash before its results leaves: the batch
    names the effect, so the resume settles it through the ledger and charges nothing."""
    db = tmp_path / "events.db"
    CHARGES.clear()
    run_once(db)
    cut_from(db, "p", first_position(db, "p", "BatchDispatched", 2) + 1)

    async def resume() -> TerminalReason:
        with trio.fail_after(30):
            async with Runtime(f"sqlite:///{db}") as runtime:
                outcome = await runtime.resume("p", Agent("payer", scripted("other-"), [charge]))
                return outcome.reason

    assert trio.run(resume) is TerminalReason.COMPLETED
    assert len(CHARGES) == 2


AGENT_MODULE = textwrap.dedent(
    '''
    from pathlib import Path
    from loop_actors import Agent, Reconciled, ScriptedModel, tool

    @tool(effect="write", reconcile=lambda amount: Reconciled(status="not_found"))
    async def charge(amount: int) -> dict:
        """Charge an amount; each charge is a line of charges.txt."""
        with open("charges.txt", "a") as ledger:
            ledger.write(f"{amount}\\n")
        return {"amount": amount}

    def decide(request):
        if request.step <= 2:
            call = {"id": f"{PREFIX}{request.step}", "name": "charge", "arguments": {"amount": 30 + 10 * request.step}}
            return {"kind": "tool_calls", "calls": [call]}
        return {"kind": "final", "answer": "charged"}

    PREFIX = Path("prefix.txt").read_text().strip()
    AGENT = Agent("payer", ScriptedModel(decide), [charge])
    '''
)


def test_the_cli_refuses_the_resume_with_exit_4_naming_audit_verify(tmp_path: Path) -> None:
    """Bad input: a cut tail (rows from the second DecisionProposed on deleted with a DELETE)
    resumed from the CLI by a model with other call ids: exit 4, one error line naming
    ``audit verify``, no second charge; ``audit verify`` of the effect itself stays ok."""
    (tmp_path / "payer_app.py").write_text(AGENT_MODULE)
    (tmp_path / "prefix.txt").write_text("c")
    db = "sqlite:///events.db"
    ran = run_cli("run", "payer_app:AGENT", "--goal", "pay", "--id", "p", cwd=tmp_path, db=db)
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "charges.txt").read_text().splitlines() == ["40", "50"]
    cut_from(
        tmp_path / "events.db",
        "p",
        first_position(tmp_path / "events.db", "p", "DecisionProposed", 2),
    )
    (tmp_path / "prefix.txt").write_text("other-")
    resumed = run_cli("resume", "p", "--agent", "payer_app:AGENT", cwd=tmp_path, db=db)
    assert resumed.returncode == 4, resumed.stderr
    assert "history was cut" in resumed.stderr
    assert "loop-actors audit verify" in resumed.stderr
    assert (tmp_path / "charges.txt").read_text().splitlines() == ["40", "50"]


def test_the_ledger_check_finds_an_invocations_effects_by_index(tmp_path: Path) -> None:
    """Resume's check reads the invocation's effects through the index of EffectPrepared rows
    by invocation (its time does not grow with the store: bench/resume_check.py), and finds
    exactly what reading every EffectPrepared row finds; other invocations' are left out."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"

    async def go() -> None:
        with trio.fail_after(60):
            async with Runtime(url) as runtime:
                for invocation_id in ("inv-a", "inv-b", "inv-c"):
                    await runtime.run(AGENT, "refund", invocation_id=invocation_id)

    trio.run(go)
    store = EventStore(url)
    try:
        for invocation_id in ("inv-a", "inv-b", "inv-c"):
            indexed = [effect.key for effect in store.effects_of(invocation_id)]
            assert indexed == [effect.key for effect in store.effects_of_by_scan(invocation_id)]
            assert len(indexed) == 1
        recorder = store._recorder
        assert isinstance(recorder, LeanSQLiteRecorder)
        with recorder.datastore.transaction(commit=False) as cursor:
            cursor.execute(
                "EXPLAIN QUERY PLAN SELECT originator_id FROM stored_events "  # noqa: S608 (constants)
                "WHERE topic = 'aggregates.effect:EffectPrepared' AND "
                f"{recorder._INVOCATION_OF_ROW} = ?",
                ("inv-a",),
            )
            plan = " ".join(str(row[-1]) for row in cursor.fetchall())
    finally:
        store.close()
    assert recorder.EFFECT_INDEX in plan
