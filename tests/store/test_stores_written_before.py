"""Stores written by loop-actors 0.1.0 still read, audit, resume and answer from read models.

``tests/fixtures/store-0.1.0.sql`` (SQLite) and ``store-0.1.0.pg.sql`` (PostgreSQL) were
written by ``tests/support/fixture_stores.py`` at ``779b21a``, before the package was reorganised;
``tests.support.fixture_stores.INVOCATIONS`` says what each fixed id holds. Each fixture is restored into a new SQLite file and
a new PostgreSQL database (once for the tests that only read it, once per test for
those that continue its invocations), and the installed ``loop-actors`` command is
run on it as a user would, in a real process. The expected values are the
facts that version printed (reasons, states, counts, keys, digests, hashes), not its
layout: they must hold for every later version.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from loop_actors import EventStore, open_runner
from projections import list_open_effects, load_trajectory, metrics
from tests.support.fixture_stores import POSTGRES_DUMP, SQLITE_DUMP
from tests.support.restored_stores import BACKENDS, Restored, restored_store

pytestmark = pytest.mark.slow

AGENT = "tests.fixture_agents:agent"
"""How the CLI names the fixture's agent (imported from the repository's root)."""

KILLED_EFFECT = "eff-c1f6237cfab794c1db186b0d139882b7caa3936a"
"""The key of ``fx-killed``'s refund, dispatched when the process was killed."""

COMPLETED_EFFECT = "eff-50492789d10d5cac2c59558ea8cb706721fe8bd7"
"""The key of ``fx-completed``'s refund of 40 on A-1 (committed)."""

APPROVAL_DIGEST = "0fb5bc02429ccc050f2cdf29c93ce6823fdd49ba9070129ad844db9099c9bf4b"
"""The digest of the batch ``fx-approval`` waits with (a refund of 250 on A-2)."""

LOG_HEADS = {
    "sqlite": "a58b763b31f064a8cff66d53bd4c8da93d8d4f3c1c006363cd1b3222ae114d0a",
    "postgresql": "96faed436f923aa020cc7b9469d1c54a109a08724b385dd419d9eb7ae7bcd5e2",
}
"""The head of each fixture's global log chain (139 rows), as ``audit verify`` printed it."""

LISTED = {
    "fx-completed": ("terminated", "completed", 3, 2, "refund order A-1"),
    "fx-approval": ("paused", "approval_required", 1, 0, "refund order A-2 in full"),
    "fx-clarify": ("paused", "clarification_required", 1, 0, "where is my order?"),
    "fx-killed": ("running", None, 1, 1, "refund order A-3"),
    "fx-cancelled": ("terminated", "cancelled", 1, 0, "where is my order?"),
    "fx-cannot": ("terminated", "cannot_continue", 2, 1, "look up order B-7"),
    "fx-long": ("terminated", "completed", 35, 34, "check the archived orders"),
}
"""``list --json`` of each fixed id: status, reason, steps, tool calls, goal."""

HISTORIES = {
    "fx-completed": [
        "InvocationStarted",
        "DecisionProposed",
        "BatchDispatched",
        "ResultsCommitted",
        "DecisionProposed",
        "BatchDispatched",
        "ResultsCommitted",
        "DecisionProposed",
        "Terminated",
    ],
    "fx-approval": ["InvocationStarted", "DecisionProposed", "Paused"],
    "fx-clarify": ["InvocationStarted", "DecisionProposed", "Paused"],
    "fx-killed": ["InvocationStarted", "DecisionProposed", "BatchDispatched"],
    "fx-cancelled": ["InvocationStarted", "DecisionProposed", "Paused", "Terminated"],
    "fx-cannot": [
        "InvocationStarted",
        "DecisionProposed",
        "BatchDispatched",
        "ResultsCommitted",
        "DecisionProposed",
        "Terminated",
    ],
    "fx-long": [
        "InvocationStarted",
        *["DecisionProposed", "BatchDispatched", "ResultsCommitted"] * 34,
        "DecisionProposed",
        "Terminated",
    ],
    COMPLETED_EFFECT: ["EffectPrepared", "EffectDispatched", "EffectCommitted"],
    KILLED_EFFECT: ["EffectPrepared", "EffectDispatched"],
    "cancel:fx-cancelled": ["CancelRequested"],
}
"""The event types ``history --json`` prints for each id (invocations, effects, a cancel)."""

SHOWN = {
    "fx-completed": ("completed", "terminated", "refunded A-1: rf-A-1-40", None),
    "fx-approval": ("approval_required", "paused", None, APPROVAL_DIGEST),
    "fx-clarify": ("clarification_required", "paused", None, "which order?"),
    "fx-killed": (None, "running", None, None),
    "fx-cancelled": (
        "cancelled",
        "terminated",
        None,
        "cancelled by ops while paused: customer left",
    ),
    "fx-cannot": ("cannot_continue", "terminated", None, "no order B-7"),
    "fx-long": ("completed", "terminated", "34 archived orders checked", None),
}
"""``show --json`` of each fixed id: reason, status, answer, detail."""

METRICS_BY_REASON = {
    "approval_required": (1, 0, 1.0, 0, 10, 5, {}, {}),
    "cancelled": (1, 0, 1.0, 0, 10, 5, {}, {}),
    "cannot_continue": (1, 0, 2.0, 1, 20, 10, {"tool_failed": 1}, {}),
    "clarification_required": (1, 0, 1.0, 0, 10, 5, {}, {}),
    "completed": (2, 0, 19.0, 36, 380, 190, {}, {"committed": 1}),
    "running": (1, 1, 1.0, 1, 10, 5, {}, {"dispatched": 1}),
}
"""``metrics --json`` by reason: invocations, running, mean steps, tool calls, tokens in and
out, failed calls by class, effects by status."""


@pytest.fixture(scope="module", params=BACKENDS)
def fixture_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Restored]:
    """Each fixture restored once, for the tests that only read it (they append nothing)."""
    folder = tmp_path_factory.mktemp(request.param)
    with restored_store(request.param, folder, SQLITE_DUMP, POSTGRES_DUMP) as store:
        yield store


@pytest.fixture(params=BACKENDS)
def restored(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Restored]:
    """Each fixture restored for one test that continues its invocations."""
    with restored_store(request.param, tmp_path, SQLITE_DUMP, POSTGRES_DUMP) as store:
        yield store


def test_list_shows_each_invocation_as_it_stopped(fixture_store: Restored) -> None:
    rows = fixture_store.json_lines("list")
    assert {
        row["invocation_id"]: (
            row["status"],
            row["reason"],
            row["steps"],
            row["tool_calls"],
            row["goal"],
        )
        for row in rows
    } == LISTED
    assert {(row["agent"], row["task_class"]) for row in rows} == {("fixture-desk", "support")}


def test_list_by_queue_status_names_the_paused_invocations(fixture_store: Restored) -> None:
    rows = fixture_store.json_lines("list", "--status", "paused")
    assert sorted(row["invocation_id"] for row in rows) == ["fx-approval", "fx-clarify"]


@pytest.mark.parametrize("invocation_id", sorted(HISTORIES))
def test_history_holds_the_events_the_fixture_wrote(
    fixture_store: Restored, invocation_id: str
) -> None:
    records = fixture_store.json_lines("history", invocation_id)
    assert [r["type"] for r in records] == HISTORIES[invocation_id]
    assert [r["position"] for r in records] == list(range(1, len(records) + 1))


def test_history_of_the_killed_invocation_ends_with_its_write_dispatched(
    fixture_store: Restored,
) -> None:
    dispatched = fixture_store.json_lines("history", "fx-killed")[-1]["data"]
    assert [(c["name"], c["effect"], c["effect_key"]) for c in dispatched["calls"]] == [
        ("refund", "write", KILLED_EFFECT)
    ]
    assert dispatched["calls"][0]["arguments"] == {"order_id": "A-3", "amount": 60}


def test_history_of_the_paused_approval_names_the_waiting_call(fixture_store: Restored) -> None:
    paused = fixture_store.json_lines("history", "fx-approval")[-1]["data"]
    assert paused["proposal_digest"] == APPROVAL_DIGEST
    assert paused["needs_approval"] == ["r1"]


@pytest.mark.parametrize("invocation_id", sorted(SHOWN))
def test_show_prints_the_reason_state_and_detail(
    fixture_store: Restored, invocation_id: str
) -> None:
    [shown] = fixture_store.json_lines("show", invocation_id)
    assert (shown["reason"], shown["status"], shown["answer"], shown["detail"]) == SHOWN[
        invocation_id
    ]
    assert len(shown["steps"]) == LISTED[invocation_id][2]


def test_show_of_the_killed_invocation_has_its_write_dispatched(fixture_store: Restored) -> None:
    [shown] = fixture_store.json_lines("show", "fx-killed")
    [call] = shown["steps"][0]["calls"]
    assert (call["name"], call["status"], call["effect_key"], call["effect_status"]) == (
        "refund",
        "dispatched",
        KILLED_EFFECT,
        "dispatched",
    )


def test_audit_verify_finds_every_chain_and_the_snapshot_intact(fixture_store: Restored) -> None:
    result = fixture_store.cli("audit", "verify")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "11 intact, 0 broken" in result.stdout
    assert (
        "every stored row checked: 139 events of 7 invocations, 2 effects and 1 cancel "
        "requests; 1 snapshots"
    ) in result.stdout


def test_audit_verify_recomputes_the_log_head_the_fixture_had(fixture_store: Restored) -> None:
    lines = fixture_store.json_lines("audit", "verify")
    [log] = [line for line in lines if line["kind"] == "log"]
    assert (log["size"], log["head"]) == (139, LOG_HEADS[fixture_store.backend])
    snapshots = [(line["id"], line["intact"]) for line in lines if line["kind"] == "snapshot"]
    assert snapshots == [("fx-long", True)]
    kinds = Counter(line["kind"] for line in lines if line["kind"] not in ("log", "coverage"))
    assert kinds == {"invocation": 7, "effect": 2, "cancel_request": 1, "snapshot": 1}


def test_metrics_by_reason_count_the_fixture_invocations(fixture_store: Restored) -> None:
    rows = fixture_store.json_lines("metrics", "--by", "reason")
    assert {
        row["group"]: (
            row["invocations"],
            row["running"],
            row["steps_mean"],
            row["tool_calls"],
            row["input_tokens"],
            row["output_tokens"],
            row["failed_calls"],
            row["effects"],
        )
        for row in rows
    } == METRICS_BY_REASON


def test_effects_lists_the_killed_invocation_write_for_the_sweeper(fixture_store: Restored) -> None:
    rows = fixture_store.json_lines("effects", "--agent", AGENT)
    assert [
        (r["effect_key"], r["invocation_id"], r["tool"], r["status"], r["attempt"], r["needs"])
        for r in rows
    ] == [(KILLED_EFFECT, "fx-killed", "refund", "dispatched", 1, "sweeper")]


def test_the_read_models_answer_through_the_python_api(fixture_store: Restored) -> None:
    views = fixture_store.desk.path.with_name("views.db")
    store = EventStore(fixture_store.url, create=False)
    try:
        runner = open_runner(store, str(views))
        try:
            runner.catch_up()
            long = load_trajectory(runner, "fx-long")
            assert long is not None
            assert (long.reason, long.events, len(long.steps), long.tool_calls) == (
                "completed",
                105,
                35,
                34,
            )
            assert {row.group: row.invocations for row in metrics(runner, "agent")} == {
                "fixture-desk": 7
            }
            assert [e["effect_key"] for e in list_open_effects(runner)] == [KILLED_EFFECT]
        finally:
            runner.close()
    finally:
        store.close()


def test_resume_completes_the_killed_invocation_with_its_refund_made_once(
    restored: Restored,
) -> None:
    [outcome] = restored.json_lines("resume", "fx-killed", "--agent", AGENT)
    assert (outcome["reason"], outcome["answer"], outcome["steps"], outcome["tool_calls"]) == (
        "completed",
        "refunded A-3: rf-A-3-60",
        2,
        1,
    )
    assert restored.desk.refunds() == [(KILLED_EFFECT, "A-3", 60)]
    # Asked first, the desk had never seen the key: the one request is the second attempt.
    assert restored.desk.attempts() == [(KILLED_EFFECT, "A-3", 2)]
    results = [
        result
        for record in restored.json_lines("history", "fx-killed")
        if record["type"] == "ResultsCommitted"
        for result in record["data"]["results"]
    ]
    assert [(r["call_id"], r["effect_status"]) for r in results] == [("r1", "committed")]


def test_resume_of_a_stopped_invocation_prints_its_recorded_outcome(restored: Restored) -> None:
    """The snapshotted one is read from its snapshot; nothing runs, nothing is appended."""
    result = restored.cli("resume", "fx-long", "--agent", AGENT, "--json")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert (outcome["reason"], outcome["answer"], outcome["steps"]) == (
        "completed",
        "34 archived orders checked",
        35,
    )
    cancelled = restored.cli("resume", "fx-cancelled", "--agent", AGENT, "--json")
    assert cancelled.returncode == 4, cancelled.stderr
    assert json.loads(cancelled.stdout)["reason"] == "cancelled"
    assert len(restored.json_lines("history", "fx-long")) == 105


def test_approve_continues_the_paused_refund_to_its_end(restored: Restored) -> None:
    [outcome] = restored.json_lines(
        "approve",
        "fx-approval",
        "--digest",
        APPROVAL_DIGEST,
        "--by",
        "alice",
        "--note",
        "receipt seen",
        "--agent",
        AGENT,
    )
    assert (outcome["reason"], outcome["answer"], outcome["steps"], outcome["tool_calls"]) == (
        "completed",
        "refunded A-2: rf-A-2-250",
        2,
        1,
    )
    assert [(order, attempt) for _, order, attempt in restored.desk.attempts()] == [("A-2", 1)]
    types = [r["type"] for r in restored.json_lines("history", "fx-approval")]
    assert types[3:] == [
        "ApprovalGranted",
        "BatchDispatched",
        "ResultsCommitted",
        "DecisionProposed",
        "Terminated",
    ]


def test_clarify_continues_the_paused_question_to_its_end(restored: Restored) -> None:
    [outcome] = restored.json_lines(
        "clarify", "fx-clarify", "--answer", "A-3", "--by", "bob", "--agent", AGENT
    )
    assert (outcome["reason"], outcome["answer"], outcome["steps"], outcome["tool_calls"]) == (
        "completed",
        "order A-3 is lost in transit",
        3,
        1,
    )


def test_audit_verify_passes_once_the_fixture_invocations_are_continued(
    restored: Restored,
) -> None:
    """New events chain onto the ones the earlier version wrote."""
    assert restored.cli("resume", "fx-killed", "--agent", AGENT).returncode == 0
    approved = restored.cli(
        "approve", "fx-approval", "--digest", APPROVAL_DIGEST, "--by", "alice", "--agent", AGENT
    )
    assert approved.returncode == 0, approved.stderr
    result = restored.cli("audit", "verify")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
