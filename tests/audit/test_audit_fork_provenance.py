"""`audit verify` checks a fork's claim about its source: the source's head hash at the fork point.

A fork's ``InvocationStarted`` records its source's head hash when it was forked
(``forked_from.source_head_hash``, the hash of the source's event at
``source_version``). Each chain verifies on its own, so a source rewritten before the
fork point with its chain recomputed, or a fork whose record was rewritten with its
chain recomputed, passed every chain check. Now, when the source is in the store, its
chain must have that hash there: a mismatch is a finding on the fork
(``source_head_mismatch``, exit 4); a source cut before the fork point is one too
(``source_truncated``); a source that is not in the store (deleted, or the fork copied
elsewhere) is said (``source_not_in_store``) without failing the fork's own chain.

Bad inputs tried: the source's lookup result edited and its chain recomputed; the same
edit without recomputing (the source breaks; the fork says it cannot check); the fork's
recorded head edited and its chain recomputed; the source's last event deleted; every
row of the source deleted.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.audit_coverage import Provenance
from aggregates.invocation import InvocationStarted, ResultsCommitted
from loop_actors import EventStore, ForkWrites, Runtime
from loop_actors.audit.verify import verify_all, verify_invocation
from tests.support.audit import AGENT, rewrite_chain, tamperable
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A store with ``inv-a`` (a lookup, a refund, an answer) and ``fork-a``, its fork at step 1."""
    path = tmp_path / "audit.db"

    async def go() -> None:
        with trio.fail_after(60):
            async with Runtime(f"sqlite:///{path}") as runtime:
                await runtime.run(AGENT, "refund", invocation_id="inv-a")
                await runtime.fork(
                    "inv-a", at_step=1, by="ops", reason="again", fork_id="fork-a", run=False
                )

    trio.run(go)
    return path


def verify(db: Path, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """``audit verify ARGS --json``: its exit code and its reports by id."""
    result = run_cli(
        "audit", "verify", *args, "--json", "--no-state",
        cwd=db.parent, db="sqlite:///audit.db", timeout=60,
    )  # fmt: skip
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return result.returncode, {line["id"]: line for line in lines if "id" in line}


def stored(db: Path, invocation_id: str) -> list[Any]:
    store = EventStore(f"sqlite:///{db}", read_only=True)
    try:
        return store.events(invocation_id)
    finally:
        store.close()


def lookup_result_position(db: Path) -> int:
    """The position of the source's first ``ResultsCommitted`` (its lookup: before the fork point)."""
    return next(
        e.originator_version for e in stored(db, "inv-a") if isinstance(e, ResultsCommitted)
    )


def edited_results(db: Path, position: int) -> list[Any]:
    event = next(e for e in stored(db, "inv-a") if e.originator_version == position)
    [result] = event.results
    return [result.model_copy(update={"output": {"key": "policy", "value": "refund-anything"}})]


def test_an_untouched_fork_has_its_source_head_verified(db: Path) -> None:
    code, reports = verify(db)
    assert code == 0
    fork = reports["fork-a"]
    assert (fork["forked_from"], fork["provenance"], fork["intact"]) == ("inv-a", "verified", True)
    assert reports["inv-a"]["provenance"] is None  # not a fork
    text = run_cli("audit", "verify", "--no-state", cwd=db.parent, db="sqlite:///audit.db")
    assert "forked from inv-a: its source's head at the fork point verified" in text.stdout


def test_a_source_rewritten_before_the_fork_point_with_its_chain_recomputed_is_found(
    db: Path,
) -> None:
    """The source verifies on its own: only the fork's record of its head tells."""
    position = lookup_result_position(db)
    rewrite_chain(db, "inv-a", position, results=edited_results(db, position))
    code, reports = verify(db)
    assert code == 4
    assert reports["inv-a"]["intact"]
    fork = reports["fork-a"]
    assert (fork["provenance"], fork["intact"], fork["broken_at"]) == (
        "source_head_mismatch",
        False,
        None,
    )
    assert fork["problem"].startswith("source_head_mismatch: forked from inv-a at its version")
    code, reports = verify(db, "fork-a")  # the invocation's own audit checks it too
    assert (code, reports["fork-a"]["provenance"]) == (4, "source_head_mismatch")


def test_a_fork_whose_record_of_its_source_was_rewritten_is_found(db: Path) -> None:
    [started] = [e for e in stored(db, "fork-a") if isinstance(e, InvocationStarted)]
    assert started.forked_from is not None
    forged = started.forked_from.model_copy(update={"source_head_hash": "ab" * 32})
    rewrite_chain(db, "fork-a", 1, forked_from=forged)
    code, reports = verify(db)
    assert code == 4
    assert (reports["fork-a"]["provenance"], reports["fork-a"]["intact"]) == (
        "source_head_mismatch",
        False,
    )


def test_a_source_edited_in_place_is_broken_and_the_fork_says_it_cannot_check(db: Path) -> None:
    """Edited as the other tamper tests do (its hash left as it was): the source's chain breaks
    there, and the fork's claim cannot be checked against it (not a second finding)."""
    position = lookup_result_position(db)
    connection = tamperable(db)
    with connection:
        connection.execute(
            "UPDATE stored_events SET state = repacked(state, CAST(replace(CAST(plain(state) "
            "AS TEXT), 'refund-under-100', 'refund-under-999') AS BLOB)) "
            "WHERE originator_id = 'inv-a' AND originator_version = ?",
            (position,),
        )
    connection.close()
    code, reports = verify(db)
    assert code == 4
    assert reports["inv-a"]["broken_at"] == position
    fork = reports["fork-a"]
    assert (fork["provenance"], fork["intact"]) == ("source_broken", True)


def test_a_source_cut_before_the_fork_point_is_found(db: Path) -> None:
    """Its last event deleted: the source's chain is whole (a cut tail is), the fork's record is not."""
    last = len(stored(db, "inv-a"))
    connection = sqlite3.connect(db)
    with connection:
        connection.execute(
            "DELETE FROM stored_events WHERE originator_id = 'inv-a' AND originator_version = ?",
            (last,),
        )
    connection.close()
    code, reports = verify(db, "fork-a")
    assert code == 4
    assert reports["fork-a"]["provenance"] == "source_truncated"


def test_a_source_not_in_the_store_is_said_and_the_fork_still_verifies(db: Path) -> None:
    connection = sqlite3.connect(db)
    with connection:
        connection.execute(
            "DELETE FROM stored_events WHERE originator_id = 'inv-a' OR originator_id LIKE 'eff-%'"
        )
    connection.close()
    code, reports = verify(db, "fork-a")
    assert code == 0
    fork = reports["fork-a"]
    assert (fork["provenance"], fork["intact"]) == ("source_not_in_store", True)
    text = run_cli("audit", "verify", "fork-a", cwd=db.parent, db="sqlite:///audit.db")
    assert "forked from inv-a: source not in this store" in text.stdout


def test_the_python_audit_api_reports_the_provenance(db: Path) -> None:
    position = lookup_result_position(db)
    rewrite_chain(db, "inv-a", position, results=edited_results(db, position))
    store = EventStore(f"sqlite:///{db}", read_only=True)
    try:
        reports, _ = verify_all(store)
        [fork] = [r for r in verify_invocation(store, "fork-a") if r.id == "fork-a"]
    finally:
        store.close()
    assert [r.provenance for r in reports if r.id == "fork-a"] == [Provenance.SOURCE_HEAD_MISMATCH]
    assert (fork.provenance, fork.intact) == (Provenance.SOURCE_HEAD_MISMATCH, False)


def test_the_audit_of_a_fork_that_reused_its_source_write_finds_that_write_intact(
    db: Path,
) -> None:
    """A fork's dedupe reuses its source's effect key: ``audit verify FORK`` checks that effect
    against the source, which stores its batch (it was reported "deleted" before)."""

    async def go() -> None:
        with trio.fail_after(60):
            async with Runtime(f"sqlite:///{db}") as runtime:
                forked = await runtime.fork(
                    "inv-a", at_step=1, by="ops", reason="again", agent=AGENT,
                    fork_id="fork-d", writes=ForkWrites.DEDUPE,
                )  # fmt: skip
                assert forked.outcome is not None
                assert forked.outcome.reason == "completed"

    trio.run(go)
    code, reports = verify(db, "fork-d")
    assert code == 0, reports
    [effect] = [r for r in reports.values() if r["kind"] == "effect"]
    assert effect["intact"]
