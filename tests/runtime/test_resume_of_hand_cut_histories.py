"""A resume of a history cut by hand is a typed refusal or a correct resume, never a crash.

Someone with the sqlite3 shell can put a store in any state: delete an invocation's
``Terminated`` (the run then looked "decided", and resume died with "internal error:
AggregateError ... cannot go on from phase decided", exit 1), its last N rows, a row from
the middle or its first, a row of a write's ledger entry. Whatever is cut, ``resume``
either refuses with ``InconsistentHistoryError`` (the CLI exits 4, naming ``audit
verify``) or resumes correctly: no write ever runs under a second effect key. The one
exception is a cut no resume can see: the batch that dispatched a write and the first row
of the write's ledger entry deleted together, with every row of the invocation after the
batch (the store then looks like a run that crashed before that batch); ``audit verify``,
with the last-verified state of the store before the cut, must report that store broken.

Bad inputs tried, on three real histories (a paying run: a read, a write, an answer; an
approval pause: a write paused for approval, approved, resumed, answered; a failed tool
call: a read that fails, then a write, then an answer): the invocation truncated at every
position (its rows from position k on deleted, every k), every single row of the store
deleted (the invocation's and its writes' ledger rows), and, drawn by hypothesis, any set
of the store's rows deleted at once.
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loop_actors import (
    Agent,
    InconsistentHistoryError,
    InvocationNotFoundError,
    ModelRequest,
    Outcome,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolContext,
    ToolError,
    tool,
)
from loop_actors.cli import main
from tests.support.cli import run_in_process

CHARGED: list[tuple[int, str]] = []
"""Every charge made, as (amount, effect key). Each history charges each amount once."""

ASKED = itertools.count()
"""Numbers the call ids: a model asked again for a step proposes other call ids (and a
write dispatched again for them would get another effect key)."""


def _reconcile(effect_key: str) -> Reconciled:
    """The service never heard of the key: a write dispatched again keeps it."""
    del effect_key
    return Reconciled(status="not_found")


@tool(effect="write", reconcile=_reconcile)
async def charge(amount: int, context: ToolContext) -> dict[str, Any]:
    """Charge an amount once per effect key."""
    assert context.effect_key is not None
    CHARGED.append((amount, context.effect_key))
    return {"receipt": context.effect_key, "amount": amount}


@tool(effect="write", requires_approval=True, reconcile=_reconcile)
async def big_charge(amount: int, context: ToolContext) -> dict[str, Any]:
    """Charge a large amount (a person approves it first)."""
    assert context.effect_key is not None
    CHARGED.append((amount, context.effect_key))
    return {"receipt": context.effect_key, "amount": amount}


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look a value up."""
    return {"key": key, "value": "ok"}


@tool
async def flaky_lookup(key: str) -> dict[str, str]:
    """Always fails."""
    raise ToolError(f"no such key {key}", retryable=False)


def _calls(*calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "tool_calls",
        "calls": [{"id": f"{i}-{next(ASKED)}", "name": n, "arguments": a} for i, n, a in calls],
    }


def paying(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return _calls(("r1", "lookup", {"key": "policy"}))
    if request.step == 2:
        return _calls(("c2", "charge", {"amount": 40}))
    return {"kind": "final", "answer": "charged 40"}


def approving(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return _calls(("b1", "big_charge", {"amount": 900}))
    return {"kind": "final", "answer": "charged 900"}


def failing(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return _calls(("f1", "flaky_lookup", {"key": "policy"}))
    if request.step == 2:
        return _calls(("c2", "charge", {"amount": 10}))
    return {"kind": "final", "answer": "charged 10 without the policy"}


TOOLS = [charge, big_charge, lookup, flaky_lookup]


def agent_of(decide: Callable[[ModelRequest], dict[str, Any]]) -> Agent:
    return Agent("cutter", ScriptedModel(decide), TOOLS)


@dataclass(frozen=True)
class History:
    """A real history, written once into a store file, copied for each cut."""

    name: str
    decide: Callable[[ModelRequest], dict[str, Any]]
    approves: bool = False


HISTORIES = [
    History("a paying run", paying),
    History("an approval pause", approving, approves=True),
    History("a failed tool call", failing),
]

INVOCATION = "cut-me"

_written: dict[str, Path] = {}


def written(history: History, folder: Path) -> Path:
    """The store of ``history`` (written the first time it is asked for)."""
    if history.name not in _written:
        path = folder / f"{history.name.replace(' ', '-')}.db"
        url = f"sqlite:///{path}"
        agent = agent_of(history.decide)

        async def write() -> None:
            with trio.fail_after(60):
                async with Runtime(url) as runtime:
                    outcome = await runtime.run(agent, "pay", invocation_id=INVOCATION)
                    if history.approves:
                        assert outcome.reason is TerminalReason.APPROVAL_REQUIRED
                        assert outcome.digest is not None
                        await runtime.approve(INVOCATION, digest=outcome.digest, by="ops")
                        outcome = await runtime.resume(INVOCATION, agent)
                    assert outcome.reason is TerminalReason.COMPLETED

        CHARGED.clear()
        trio.run(write)
        ORIGINAL_KEYS[history.name] = dict(CHARGED)
        _written[history.name] = path
    return _written[history.name]


def rows(db: Path) -> list[tuple[int, str, int]]:
    """Every stored row: (row id, aggregate, position)."""
    connection = sqlite3.connect(db)
    try:
        return connection.execute(
            "SELECT rowid, originator_id, originator_version FROM stored_events ORDER BY rowid"
        ).fetchall()
    finally:
        connection.close()


def delete(db: Path, rowids: list[int]) -> None:
    """Delete rows by hand, as the sqlite3 shell would."""
    connection = sqlite3.connect(db)
    with connection:
        connection.executemany("DELETE FROM stored_events WHERE rowid = ?", [(i,) for i in rowids])
    connection.close()


def resume(db: Path, history: History) -> Outcome | Exception:
    """Resume the cut invocation through the public API: its outcome, or the error raised."""

    async def go() -> Outcome:
        with trio.fail_after(60):
            async with Runtime(f"sqlite:///{db}") as runtime:
                return await runtime.resume(INVOCATION, agent_of(history.decide))

    try:
        return trio.run(go)
    except (InconsistentHistoryError, InvocationNotFoundError) as error:
        return error


def check_cut(db: Path, history: History, kept: int, *, hidden: bool) -> None:
    """Resume after a cut: a typed refusal, or a resume that charges no write twice.

    ``kept`` is how many of the invocation's own rows are left; ``hidden``: the cut
    deleted a write's first ledger row together with the batch that dispatched it.
    """
    CHARGED.clear()
    result = resume(db, history)
    if isinstance(result, InvocationNotFoundError):
        assert kept == 0, result  # only when every row of the invocation is gone
        return
    if isinstance(result, InconsistentHistoryError):
        assert "audit verify" in str(result)
        assert not CHARGED, CHARGED  # nothing ran
        return
    assert isinstance(result, Outcome)
    # No write of the history runs under another effect key than the one it ran under,
    # unless the cut left nothing the resume can see: the batch that dispatched the write
    # and the first row of its ledger entry deleted together (with every row of the
    # invocation after that batch, or its history would not replay). Such a store looks
    # like a run that crashed before that batch; only the audit (which reads every row)
    # sees the ledger entry cut from its first row, and it must say so.
    original = ORIGINAL_KEYS[history.name]
    for amount, key in CHARGED:
        if key != original[amount]:
            assert hidden, f"{amount} charged again under {key}, first under {original[amount]}"
            assert audit_reports_broken(db, history), (
                f"{amount} charged again under {key} and the audit found nothing wrong"
            )


def hides_a_write(db: Path, deleted: list[int]) -> bool:
    """Whether ``deleted`` holds a write's first ledger row and the batch that dispatched it.

    The two are in one transaction: the batch's row is the invocation's row just before
    the ledger entry's first one.
    """
    connection = sqlite3.connect(db)
    try:
        stored = connection.execute(
            "SELECT rowid, originator_id, topic FROM stored_events ORDER BY rowid"
        ).fetchall()
    finally:
        connection.close()
    for rowid, _, topic in stored:
        if not topic.endswith(":EffectPrepared"):
            continue
        batch = max(
            r for r, a, t in stored if a == INVOCATION and r < rowid and t.endswith("Dispatched")
        )
        if rowid in deleted and batch in deleted:
            return True
    return False


def audit_reports_broken(db: Path, history: History) -> bool:
    """Whether ``audit verify`` reports the cut store broken (read through the public CLI).

    Against the last-verified state of the store before the cut, as a verifier that
    checked it then keeps: a cut that deleted every trace of a write (its batch, its
    ledger entry, what followed) leaves a store consistent in itself, which only what
    was verified before (or a checkpoint outside the store) can tell apart.
    """
    state = db.parent / f"{db.name}.verified.json"
    state.unlink(missing_ok=True)
    source = _written[history.name]
    assert main(["audit", "verify", "--state", str(state), "--db", f"sqlite:///{source}"]) == 0
    return main(["audit", "verify", "--state", str(state), "--db", f"sqlite:///{db}"]) != 0


ORIGINAL_KEYS: dict[str, dict[int, str]] = {}
"""Per history, the effect key each amount was charged under when it was written."""


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cut-histories")
    found = {}
    for history in HISTORIES:
        found[history.name] = written(history, folder)
    return found


def cuts_of(db: Path) -> list[tuple[str, list[int], int]]:
    """Every truncation of the invocation and every single deletion: (label, rowids, kept)."""
    stored = rows(db)
    own = [(rowid, version) for rowid, aggregate, version in stored if aggregate == INVOCATION]
    found = [
        (f"from position {k} on", [r for r, v in own if v >= k], sum(1 for _, v in own if v < k))
        for k in range(1, len(own) + 1)
    ]
    for rowid, aggregate, version in stored:
        kept = len(own) - (1 if aggregate == INVOCATION else 0)
        found.append((f"row {rowid} ({aggregate} at {version})", [rowid], kept))
    return found


@pytest.mark.parametrize("history", HISTORIES, ids=[h.name for h in HISTORIES])
def test_every_truncation_and_every_single_deletion_resumes_or_is_refused_typed(
    history: History, stores: dict[str, Path], tmp_path: Path
) -> None:
    source = stores[history.name]
    for label, deleted, kept in cuts_of(source):
        db = tmp_path / "cut.db"
        shutil.copyfile(source, db)
        delete(db, deleted)
        try:
            check_cut(db, history, kept, hidden=hides_a_write(source, deleted))
        except AssertionError as failure:
            raise AssertionError(f"{history.name}, {label}: {failure}") from failure
        except Exception as error:  # what this test is about: say which cut raised it
            raise AssertionError(
                f"{history.name}, {label}: resume raised {type(error).__name__}: {error}"
            ) from error
        db.unlink()


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_set_of_deleted_rows_resumes_or_is_refused_typed(
    data: st.DataObject, stores: dict[str, Path], tmp_path: Path
) -> None:
    history = data.draw(st.sampled_from(HISTORIES), label="history")
    source = stores[history.name]
    stored = rows(source)
    deleted = data.draw(
        st.lists(st.sampled_from([rowid for rowid, _, _ in stored]), unique=True, min_size=1),
        label="deleted row ids",
    )
    kept = sum(1 for rowid, aggregate, _ in stored if aggregate == INVOCATION) - sum(
        1 for rowid, aggregate, _ in stored if aggregate == INVOCATION and rowid in deleted
    )
    db = tmp_path / f"cut-{data.draw(st.integers(0, 10**9), label='file')}.db"
    shutil.copyfile(source, db)
    delete(db, deleted)
    try:
        check_cut(db, history, kept, hidden=hides_a_write(source, deleted))
    except AssertionError:
        raise
    except Exception as error:  # reported with the cut, which hypothesis shrinks
        raise AssertionError(f"resume raised {type(error).__name__}: {error}") from error
    finally:
        db.unlink()


def test_the_reported_cut_exits_4_from_the_cli(
    stores: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The case as reported: the Terminated row deleted, then ``loop-actors resume``."""
    shutil.copyfile(stores["a paying run"], tmp_path / "events.db")
    (last,) = [r for r, a, v in rows(tmp_path / "events.db") if a == INVOCATION][-1:]
    delete(tmp_path / "events.db", [last])
    (tmp_path / "cutter_app.py").write_text(
        "from tests.runtime.test_resume_of_hand_cut_histories import agent_of, paying\n"
        "AGENT = agent_of(paying)\n"
    )
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))
    done = run_in_process(
        "resume",
        INVOCATION,
        "--agent",
        "cutter_app:AGENT",
        cwd=tmp_path,
        db="sqlite:///events.db",
        capsys=capsys,
        monkeypatch=monkeypatch,
    )
    assert done.returncode == 4, done.stderr
    assert "internal error" not in done.stderr
    assert "history was cut" in done.stderr
    assert "loop-actors audit verify" in done.stderr


def test_a_dispatched_write_whose_ledger_entry_was_deleted_is_refused_typed(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    """The cut hypothesis found: rows 6-11 of the approval pause deleted.

    What is left is the approved batch dispatched and nothing after it, and no ledger
    entry for its write: resume raised a bare ``AggregateError`` ("effect ... is
    missing") from the turn core. Whether the write ran is unknown, so it is refused.
    """
    db = tmp_path / "cut.db"
    shutil.copyfile(stores["an approval pause"], db)
    stored = rows(db)
    connection = sqlite3.connect(db)
    try:
        topics = dict(
            connection.execute("SELECT rowid, topic FROM stored_events ORDER BY rowid").fetchall()
        )
    finally:
        connection.close()
    dispatched = next(r for r, a, _ in stored if a == INVOCATION and "BatchDispatched" in topics[r])
    after_dispatch = [r for r, a, _ in stored if a == INVOCATION and r > dispatched]
    ledger = [r for r, a, _ in stored if a != INVOCATION and "Effect" in topics[r]]
    assert after_dispatch
    assert ledger
    delete(db, after_dispatch + ledger)
    CHARGED.clear()
    result = resume(db, HISTORIES[1])
    assert isinstance(result, InconsistentHistoryError), result
    assert "has no entry in the effect ledger" in result.problem
    assert "audit verify" in result.problem
    assert not CHARGED


def test_a_write_hidden_with_the_batch_before_it_is_reported_by_the_audit(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    """The cut hypothesis found: a paying run cut back to its lookup's dispatch, with the
    charge's first ledger row deleted (its later ledger rows kept). No resume can tell it
    from a run that crashed after dispatching the lookup; the audit must."""
    source = stores["a paying run"]
    stored = rows(source)
    own = [rowid for rowid, aggregate, version in stored if aggregate == INVOCATION and version > 3]
    prepared = next(rowid for rowid, aggregate, version in stored if aggregate != INVOCATION)
    deleted = [*own, prepared]
    assert hides_a_write(source, deleted)
    db = tmp_path / "cut.db"
    shutil.copyfile(source, db)
    delete(db, deleted)
    check_cut(db, HISTORIES[0], 3, hidden=True)
    assert audit_reports_broken(db, HISTORIES[0])
