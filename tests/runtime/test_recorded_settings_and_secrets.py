"""A resume follows what was recorded: the settings and budget of the run, and its secrets.

The secrets a paused run needs (the real values of redacted arguments) outlive the
process only when a cipher seals them in the store's file; without one, a resumed
call that needs them does not run. The budget and settings recorded when the
invocation started are followed by a resume, whatever agent it is given, unless the
caller allows a change (recorded as ``SettingsChanged``).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.invocation import SettingsChanged
from loop_actors import (
    Agent,
    Budget,
    ModelRequest,
    Runtime,
    ScriptedModel,
    SettingsChangedError,
    TerminalReason,
    tool,
)
from tests.support.cli import run_cli
from tests.support.stored_bytes import readable_bytes

pytestmark = pytest.mark.slow

CARD = "4111111111111111"

PAYER_APP = f'''
"""An agent whose one write needs approval and takes a card number (written by a test)."""

from pathlib import Path

from loop_actors import Agent, ScriptedModel, tool

PAID = Path(__file__).with_name("paid.txt")


@tool(effect="write", sensitive_arguments=["card"], requires_approval=True)
def pay(card: str, amount: int) -> str:
    """Pay an amount with a card."""
    with PAID.open("a") as ledger:
        ledger.write(f"{{card}} {{amount}}\\n")
    return f"paid {{amount}}"


def decide(request):
    if request.step == 1:
        call = {{"id": "p1", "name": "pay", "arguments": {{"card": "{CARD}", "amount": 12}}}}
        return {{"kind": "tool_calls", "calls": [call]}}
    result = request.results[-1]
    if result.error is not None:
        return {{"kind": "final", "answer": "not paid: " + result.error.message}}
    return {{"kind": "final", "answer": result.output}}


agent = Agent("payer", ScriptedModel(decide), [pay])
'''


@pytest.fixture
def payer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with the payer agent module; no cipher in this process's environment."""
    monkeypatch.delenv("CIPHER_TOPIC", raising=False)
    monkeypatch.delenv("CIPHER_KEY", raising=False)
    (tmp_path / "payer_app.py").write_text(PAYER_APP)
    return tmp_path


def cipher_env() -> dict[str, str]:
    """eventsourcing's cipher settings with a fresh key."""
    from eventsourcing.cipher import AESCipher

    return {
        "CIPHER_TOPIC": "eventsourcing.cipher:AESCipher",
        "CIPHER_KEY": AESCipher.create_key(16),
    }


def db_bytes(folder: Path) -> bytes:
    """Every byte of the database files (events, WAL, shared memory, read models)."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and ".db" in p.name)
    assert files, "no database file to look into"
    return readable_bytes(files)


def sealed_secret_rows(db: Path, invocation_id: str) -> int:
    """Rows of the sealed secrets table for one invocation."""
    connection = sqlite3.connect(db)
    try:
        (count,) = connection.execute(
            "SELECT count(*) FROM loop_actors_secrets WHERE invocation_id = ?", (invocation_id,)
        ).fetchone()
    finally:
        connection.close()
    return int(count)


def checked(result: subprocess.CompletedProcess[str], exit_code: int) -> dict[str, Any]:
    """The JSON outcome a CLI command printed, after checking its exit code."""
    assert result.returncode == exit_code, (result.stdout, result.stderr)
    outcome: dict[str, Any] = json.loads(result.stdout)
    return outcome


def pause_for_approval(folder: Path, db: str, env: dict[str, str]) -> str:
    """``loop-actors run`` the payer in its own process; returns the digest it waits with."""
    paused = checked(
        run_cli("run", "payer_app:agent", "--goal", "pay 12", "--id", "pay-1", "--json",
                cwd=folder, db=db, env=env, timeout=60),
        3,
    )  # fmt: skip
    assert paused["reason"] == "approval_required"
    digest: str = paused["digest"]
    return digest


def approve_then_resume(folder: Path, db: str, env: dict[str, str], digest: str) -> dict[str, Any]:
    """``approve`` in a second process, ``resume`` in a third; returns the resumed outcome."""
    approved = run_cli(
        "approve", "pay-1", "--digest", digest, "--by", "alice", cwd=folder, db=db, env=env
    )
    assert approved.returncode == 0, approved.stderr
    return checked(
        run_cli("resume", "pay-1", "--agent", "payer_app:agent", "--json",
                cwd=folder, db=db, env=env, timeout=60),
        0,
    )  # fmt: skip


def build_read_models(folder: Path, db: str, env: dict[str, str]) -> None:
    """``loop-actors projections catch-up``: the read models' file exists and is up to date."""
    caught_up = run_cli("projections", "catch-up", cwd=folder, db=db, env=env)
    assert caught_up.returncode == 0, caught_up.stderr
    assert list(folder.glob("*.views.db")), "no read models' file"


def paid_lines(folder: Path) -> list[str]:
    """What the pay tool wrote, one line per run of it."""
    paid = folder / "paid.txt"
    return paid.read_text().splitlines() if paid.exists() else []


# --------------------------------------------------------------------- secrets across processes


def test_an_approved_call_with_a_sealed_secret_runs_once_in_a_new_process(payer: Path) -> None:
    """With a cipher, approve and resume in other processes run the call with the real card."""
    db, env = f"sqlite:///{payer / 'run.db'}", cipher_env()
    digest = pause_for_approval(payer, db, env)

    resumed = approve_then_resume(payer, db, env, digest)

    assert resumed["reason"] == "completed"
    assert paid_lines(payer) == [f"{CARD} 12"]


def test_a_sealed_secret_never_reaches_the_database_files_in_clear(payer: Path) -> None:
    db, env = f"sqlite:///{payer / 'run.db'}", cipher_env()
    digest = pause_for_approval(payer, db, env)
    assert sealed_secret_rows(payer / "run.db", "pay-1") == 1  # kept while paused

    approve_then_resume(payer, db, env, digest)
    build_read_models(payer, db, env)

    assert CARD.encode() not in db_bytes(payer)


def test_the_sealed_secrets_of_an_invocation_are_deleted_when_it_ends(payer: Path) -> None:
    db, env = f"sqlite:///{payer / 'run.db'}", cipher_env()
    digest = pause_for_approval(payer, db, env)

    approve_then_resume(payer, db, env, digest)

    assert sealed_secret_rows(payer / "run.db", "pay-1") == 0


def test_on_postgresql_a_sealed_secret_lives_in_the_store_database_until_the_call_ran(
    payer: Path, postgres_url: str
) -> None:
    """The same across processes on PostgreSQL: the sealed row is in the store's database
    while the invocation waits, gone once it ended, and the card is in no row in clear."""
    import psycopg

    env = cipher_env()
    digest = pause_for_approval(payer, postgres_url, env)
    with psycopg.connect(postgres_url) as connection:
        (kept,) = connection.execute(
            "SELECT count(*) FROM loop_actors_secrets WHERE invocation_id = 'pay-1'"
        ).fetchone() or (None,)
    assert kept == 1

    resumed = approve_then_resume(payer, postgres_url, env, digest)

    assert resumed["reason"] == "completed"
    assert paid_lines(payer) == [f"{CARD} 12"]
    with psycopg.connect(postgres_url) as connection:
        (left,) = connection.execute("SELECT count(*) FROM loop_actors_secrets").fetchone() or (
            None,
        )
        (in_clear,) = connection.execute(
            "SELECT count(*) FROM loopactors_events WHERE position(%s in state) > 0",
            (CARD.encode(),),
        ).fetchone() or (None,)
    assert (left, in_clear) == (0, 0)


def test_a_paused_invocations_sealed_secret_moves_with_store_copy_and_runs_there(
    payer: Path, postgres_url: str
) -> None:
    """Paused on SQLite with a sealed card; copied to PostgreSQL; approved and resumed there."""
    sqlite_db, env = f"sqlite:///{payer / 'run.db'}", cipher_env()
    digest = pause_for_approval(payer, sqlite_db, env)
    copied = run_cli(
        "store", "copy", "--from", sqlite_db, "--to", postgres_url, "--json", cwd=payer, env=env
    )
    assert copied.returncode == 0, copied.stderr
    assert json.loads(copied.stdout)["secrets"] == 1

    resumed = approve_then_resume(payer, postgres_url, env, digest)

    assert resumed["reason"] == "completed"
    assert paid_lines(payer) == [f"{CARD} 12"]


def test_without_a_cipher_a_call_resumed_in_a_new_process_does_not_run_and_says_why(
    payer: Path,
) -> None:
    db = f"sqlite:///{payer / 'run.db'}"
    digest = pause_for_approval(payer, db, {})

    resumed = approve_then_resume(payer, db, {}, digest)

    assert paid_lines(payer) == []
    history = run_cli("history", "pay-1", "--json", cwd=payer, db=db)
    results = [
        record["data"]["results"]
        for record in map(json.loads, history.stdout.splitlines())
        if record["type"] == "ResultsCommitted"
    ]
    assert [r[0]["error"]["error_class"] for r in results] == ["invalid_arguments"]
    # The scripted model answers with the error message its result carried.
    assert resumed["reason"] == "completed"
    assert resumed["answer"].startswith("not paid: ")
    assert "secret store" in resumed["answer"]
    assert "cipher" in resumed["answer"]


def test_without_a_cipher_the_card_never_reaches_the_database_files(payer: Path) -> None:
    db = f"sqlite:///{payer / 'run.db'}"
    digest = pause_for_approval(payer, db, {})

    approve_then_resume(payer, db, {}, digest)
    build_read_models(payer, db, {})

    assert CARD.encode() not in db_bytes(payer)


# --------------------------------------------------------------------- recorded settings


class Clock:
    """A wall clock that moves only when told to (for ``Runtime(now=...)``)."""

    def __init__(self) -> None:
        self.at = datetime(2025, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


@tool
def note(n: int) -> str:
    """Write a note down."""
    return f"noted {n}"


def ask_first(then: Callable[[ModelRequest], dict[str, Any]]) -> ScriptedModel:
    """A model that asks a question at step 1 (the invocation pauses), then follows ``then``."""

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {"kind": "clarification", "question": "Which notes?"}
        return then(request)

    return ScriptedModel(decide)


def notes_until_step_10(request: ModelRequest) -> dict[str, Any]:
    """A new note each step (never the same plan twice), a final answer at step 10."""
    if request.step >= 10:
        return {"kind": "final", "answer": "ten steps"}
    call = {"id": f"n{request.step}", "name": "note", "arguments": {"n": request.step}}
    return {"kind": "tool_calls", "calls": [call]}


def numbered_answers(request: ModelRequest) -> dict[str, Any]:
    return {"kind": "final", "answer": f"answer {request.step}"}


def third_answer_passes(answer: str, turns: object) -> bool:
    """Refuses the answers of steps 2 and 3; passes the one of step 4."""
    return answer == "answer 4"


async def paused_on_a_question(db_url: str, agent: Agent, *, now: Clock | None = None) -> str:
    """Run ``agent`` until it asks its question, and answer it; returns the invocation id."""
    runtime = Runtime(db_url) if now is None else Runtime(db_url, now=now)
    with trio.fail_after(10):
        paused = await runtime.run(agent, "take notes", invocation_id="notes-1")
        assert paused.reason is TerminalReason.CLARIFICATION_REQUIRED
        await runtime.clarify("notes-1", answer="all of them", by="bob")
    return "notes-1"


def short_agent() -> Agent:
    return Agent("noter", ask_first(notes_until_step_10), [note], Budget(max_steps=3))


def long_agent() -> Agent:
    return Agent("noter", ask_first(notes_until_step_10), [note], Budget(max_steps=50))


async def test_resume_follows_the_recorded_max_steps_not_the_agents(db_url: str) -> None:
    invocation_id = await paused_on_a_question(db_url, short_agent())

    with trio.fail_after(10):
        outcome = await Runtime(db_url).resume(invocation_id, long_agent())

    assert outcome.reason is TerminalReason.MAX_STEPS
    assert outcome.steps == 3


def checked_agent(attempts: int) -> Agent:
    return Agent(
        "checked",
        ask_first(numbered_answers),
        verifier=third_answer_passes,
        max_verification_attempts=attempts,
    )


async def test_resume_follows_the_recorded_max_verification_attempts(db_url: str) -> None:
    invocation_id = await paused_on_a_question(db_url, checked_agent(1))

    with trio.fail_after(10):
        outcome = await Runtime(db_url).resume(invocation_id, checked_agent(5))

    assert outcome.reason is TerminalReason.VERIFICATION_FAILED


async def test_resume_allowed_to_change_settings_uses_the_agents_verification_attempts(
    db_url: str,
) -> None:
    invocation_id = await paused_on_a_question(db_url, checked_agent(1))

    with trio.fail_after(10):
        outcome = await Runtime(db_url).resume(
            invocation_id, checked_agent(5), allow_settings_change=True
        )

    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.answer == "answer 4"


async def test_resume_allowed_to_change_settings_uses_the_agents_limits(db_url: str) -> None:
    invocation_id = await paused_on_a_question(db_url, short_agent())

    with trio.fail_after(10):
        outcome = await Runtime(db_url).resume(
            invocation_id, long_agent(), allow_settings_change=True
        )

    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.steps == 10


async def test_resume_allowed_to_change_settings_records_settings_changed(db_url: str) -> None:
    invocation_id = await paused_on_a_question(db_url, short_agent())
    runtime = Runtime(db_url)

    with trio.fail_after(10):
        await runtime.resume(invocation_id, long_agent(), allow_settings_change=True)
        history = await runtime.history(invocation_id)

    changed = [e for e in history if isinstance(e, SettingsChanged)]
    assert len(changed) == 1
    assert changed[0].budget.max_steps == 50


# --------------------------------------------------------------------- the recorded deadline


def final_answer(request: ModelRequest) -> dict[str, Any]:
    return {"kind": "final", "answer": "done"}


async def test_the_recorded_deadline_holds_on_resume_with_an_agent_without_one(
    db_url: str,
) -> None:
    clock = Clock()
    with_deadline = Agent("timed", ask_first(final_answer), budget=Budget(deadline_s=60))
    invocation_id = await paused_on_a_question(db_url, with_deadline, now=clock)
    clock.advance(120)

    without_deadline = Agent("timed", ask_first(final_answer))
    with trio.fail_after(10):
        outcome = await Runtime(db_url, now=clock).resume(invocation_id, without_deadline)

    assert outcome.reason is TerminalReason.DEADLINE_EXCEEDED


async def test_a_resume_allowed_to_change_settings_drops_the_recorded_deadline(
    db_url: str,
) -> None:
    clock = Clock()
    with_deadline = Agent("timed", ask_first(final_answer), budget=Budget(deadline_s=60))
    invocation_id = await paused_on_a_question(db_url, with_deadline, now=clock)
    clock.advance(120)

    without_deadline = Agent("timed", ask_first(final_answer))
    with trio.fail_after(10):
        outcome = await Runtime(db_url, now=clock).resume(
            invocation_id, without_deadline, allow_settings_change=True
        )

    assert outcome.reason is TerminalReason.COMPLETED


# --------------------------------------------------------------------- recorded approval rules


PAID: list[int] = []


def refund_agent(*, requires_approval: bool) -> Agent:
    @tool(effect="write", requires_approval=requires_approval)
    def refund(order_id: str, amount: int) -> str:
        """Refund an amount on an order."""
        PAID.append(amount)
        return f"refunded {amount}"

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            call = {"id": "r1", "name": "refund", "arguments": {"order_id": "A-1", "amount": 9}}
            return {"kind": "tool_calls", "calls": [call]}
        return {"kind": "final", "answer": str(request.results[-1].output)}

    return Agent("refunder", ScriptedModel(decide), [refund])


async def approved_refund(db_url: str) -> str:
    """A refund that needed approval and got it (not resumed yet); returns its id."""
    runtime = Runtime(db_url)
    with trio.fail_after(10):
        paused = await runtime.run(
            refund_agent(requires_approval=True), "refund A-1", invocation_id="refund-1"
        )
        assert paused.digest is not None
        await runtime.approve("refund-1", digest=paused.digest, by="alice")
    return "refund-1"


async def test_resume_with_a_changed_approval_rule_is_refused_and_records_nothing(
    db_url: str,
) -> None:
    invocation_id = await approved_refund(db_url)
    runtime = Runtime(db_url)
    before = await runtime.history(invocation_id)

    with trio.fail_after(10), pytest.raises(SettingsChangedError, match="refund"):
        await runtime.resume(invocation_id, refund_agent(requires_approval=False))

    assert await runtime.history(invocation_id) == before


async def test_resume_allowed_to_change_settings_goes_on_with_a_changed_approval_rule(
    db_url: str,
) -> None:
    invocation_id = await approved_refund(db_url)
    PAID.clear()

    with trio.fail_after(10):
        outcome = await Runtime(db_url).resume(
            invocation_id, refund_agent(requires_approval=False), allow_settings_change=True
        )

    assert outcome.reason is TerminalReason.COMPLETED
    assert PAID == [9]
