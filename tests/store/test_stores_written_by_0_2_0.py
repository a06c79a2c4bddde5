"""Stores written by loop-actors 0.2.0 still read, audit, resume and replay.

``tests/fixtures/store-0.2.0.sql`` (SQLite) and ``store-0.2.0.pg.sql`` (PostgreSQL) were
written by ``tests/support/fixture_stores_0_2_0.py`` with the code of 0.2.0, its agents
``tests/fixture_agents_0_2_0.py``; ``INVOCATIONS`` there says what each fixed id holds:
model-input digests in every decision, a ``wait`` (decision schema 3), a tool's sleep
and an early wake, a sub-agent's child invocation with its reserved and returned
budget, a handoff, two forks, a run killed by SIGKILL. Each fixture is restored into a
new SQLite file and a new PostgreSQL database (once for the tests that only read it,
once per test for those that continue its invocations), and the installed
``loop-actors`` command is run on it as a user would, in a real process. The expected
values are the facts 0.2.0 printed: they must hold for every later version.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fixture_stores_0_2_0 import AGENT_REF, POSTGRES_DUMP, SQLITE_DUMP
from tests.support.restored_stores import BACKENDS, Restored, restored_store

pytestmark = pytest.mark.slow

CHILD = "child-485d2d9c783e6cf9c5c6f2ab78daa828"
"""The auditor's child invocation, started by ``fx2-parent``'s ``audit_order`` call."""

HANDOFF_TARGET = "handoff-a82c48b75a4c6ad3cee274abc0588a5a"
"""Billing's invocation, which ``fx2-handoff`` handed the conversation to."""

KILLED_EFFECT = "eff-cb4ace4641b5df0c40be913745d42edbed4ad9fe"
"""The key of ``fx2-killed``'s refund of 60 on A-3, dispatched when the process was killed."""

COMPLETED_EFFECT = "eff-0dda843ab2b5feb2ccf7952d73664be985832998"
"""The key of ``fx2-completed``'s refund of 40 on A-1 (committed; ``fx2-fork`` reused it)."""

APPROVAL_DIGEST = "c32e60e938b88bcb1e34008ce3785cf5aa45ee813aed4cde9fc145d558cabbe2"
"""The digest of the batch ``fx2-approval`` waits with (a refund of 250 on A-2)."""

FORK_APPROVAL_DIGEST = "4d1a889541449ab9f6b02d79fc79620b88dc0d87f9b7d2f6f7024c39b8ad7ef1"
"""The digest of the batch ``fx2-fork-paused`` waits with (the source's refund, repeated)."""

LOG_HEADS = {
    "sqlite": "a605f4dcf8eaa75d6df767dd0f09c7acd176d1115d9a7a82d12ea18a5f362908",
    "postgresql": "f044b316baed4f7d570d4d239a0105384b35dc2eaf706861daf0fa6bd84e1857",
}
"""The head of each fixture's global log chain (74 rows), as ``audit verify`` printed it."""

LISTED = {
    "fx2-completed": ("terminated", "completed", 3, 2, "fixture-desk-2"),
    "fx2-approval": ("paused", "approval_required", 1, 0, "fixture-desk-2"),
    "fx2-sleeping": ("paused", "sleeping", 1, 1, "fixture-desk-2"),
    "fx2-woken": ("terminated", "completed", 2, 0, "fixture-desk-2"),
    "fx2-parent": ("terminated", "completed", 2, 1, "fixture-desk-2"),
    CHILD: ("terminated", "completed", 2, 1, "fixture-auditor"),
    "fx2-handoff": ("terminated", "handed_off", 2, 1, "fixture-desk-2"),
    HANDOFF_TARGET: ("terminated", "completed", 1, 0, "fixture-billing"),
    "fx2-fork": ("terminated", "completed", 3, 2, "fixture-desk-2"),
    "fx2-fork-paused": ("paused", "approval_required", 2, 1, "fixture-desk-2"),
    "fx2-killed": ("running", None, 1, 1, "fixture-desk-2"),
}
"""``list --json`` of each id: status, reason, steps, tool calls, agent."""

A_STEP = ["DecisionProposed", "BatchDispatched", "ResultsCommitted"]

HISTORIES = {
    "fx2-completed": [*["InvocationStarted"], *A_STEP, *A_STEP, "DecisionProposed", "Terminated"],
    "fx2-approval": ["InvocationStarted", "DecisionProposed", "Paused"],
    "fx2-sleeping": ["InvocationStarted", "DecisionProposed", "BatchDispatched", "Paused"],
    "fx2-woken": [
        "InvocationStarted",
        "DecisionProposed",
        "Paused",
        "SleepEnded",
        "DecisionProposed",
        "Terminated",
    ],
    "fx2-parent": [
        "InvocationStarted",
        "DecisionProposed",
        "BatchDispatched",
        "BudgetReserved",
        "ResultsCommitted",
        "BudgetReturned",
        "DecisionProposed",
        "Terminated",
    ],
    CHILD: ["InvocationStarted", *A_STEP, "DecisionProposed", "Terminated"],
    "fx2-handoff": ["InvocationStarted", *A_STEP, "DecisionProposed", "Terminated"],
    HANDOFF_TARGET: ["InvocationStarted", "DecisionProposed", "Terminated"],
    "fx2-fork": ["InvocationStarted", *A_STEP, *A_STEP, "DecisionProposed", "Terminated"],
    "fx2-fork-paused": ["InvocationStarted", *A_STEP, "DecisionProposed", "Paused"],
    "fx2-killed": ["InvocationStarted", "DecisionProposed", "BatchDispatched"],
    COMPLETED_EFFECT: ["EffectPrepared", "EffectDispatched", "EffectCommitted"],
    KILLED_EFFECT: ["EffectPrepared", "EffectDispatched"],
}
"""The event types ``history --json`` prints for each id (invocations, effects)."""


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
            row["agent"],
        )
        for row in rows
    } == LISTED


@pytest.mark.parametrize("invocation_id", sorted(HISTORIES))
def test_history_holds_the_events_the_fixture_wrote(
    fixture_store: Restored, invocation_id: str
) -> None:
    records = fixture_store.json_lines("history", invocation_id)
    assert [r["type"] for r in records] == HISTORIES[invocation_id]
    assert {r["format"] for r in records} == {2}  # audit format 2, every one


def test_every_decision_holds_its_model_input_digests_and_the_providers_usage(
    fixture_store: Restored,
) -> None:
    for invocation_id in ("fx2-completed", CHILD, HANDOFF_TARGET, "fx2-woken"):
        decisions = [
            r["data"]
            for r in fixture_store.json_lines("history", invocation_id)
            if r["type"] == "DecisionProposed"
        ]
        assert decisions
        for data in decisions:
            assert set(data["model_input"]) >= {"view", "turns"}
            usage = data["usage"]
            assert (usage["provider"], usage["model"], usage["cache_read_input_tokens"]) == (
                "fixture",
                "desk-model-1",
                8,
            )
        assert {"model", "instructions", "tools"} <= set(decisions[0]["model_input"])
    [wait] = [
        r["data"]["decision"]
        for r in fixture_store.json_lines("history", "fx2-woken")
        if r["type"] == "DecisionProposed" and r["data"]["step"] == 1
    ]
    assert (wait["schema_version"], wait["kind"]) == (3, "wait")


def test_the_starts_say_where_each_invocation_came_from(fixture_store: Restored) -> None:
    def started(invocation_id: str) -> dict[str, object]:
        data: dict[str, object] = fixture_store.json_lines("history", invocation_id)[0]["data"]
        return data

    fork = started("fx2-fork")["forked_from"]
    assert isinstance(fork, dict)
    assert (fork["source_id"], fork["at_step"], fork["writes"], fork["by"]) == (
        "fx2-completed",
        1,
        "dedupe",
        "ops",
    )
    assert [w["effect_key"] for w in fork["source_writes"]] == [COMPLETED_EFFECT]
    parent = started(CHILD)["parent"]
    assert isinstance(parent, dict)
    assert (parent["parent_id"], parent["depth"]) == ("fx2-parent", 1)
    origin = started(HANDOFF_TARGET)["handed_off_from"]
    assert isinstance(origin, dict)
    assert (origin["source_id"], origin["history"]) == ("fx2-handoff", "summary")
    trace_parent = started("fx2-completed")["trace_parent"]
    assert isinstance(trace_parent, dict)
    assert set(trace_parent) == {"trace_id", "span_id"}


def test_show_prints_the_sleep_and_the_lineage(fixture_store: Restored) -> None:
    [sleeping] = fixture_store.json_lines("show", "fx2-sleeping")
    assert (sleeping["reason"], sleeping["status"], sleeping["detail"]) == (
        "sleeping",
        "paused",
        "1 call(s) sleep until 2099-01-01T09:00:00+00:00",
    )
    assert fixture_store.json_lines("show", "fx2-fork")[0]["forked_from"] == "fx2-completed"
    assert fixture_store.json_lines("show", CHILD)[0]["parent_id"] == "fx2-parent"


def test_audit_verify_finds_every_chain_intact(fixture_store: Restored) -> None:
    result = fixture_store.cli("audit", "verify", "--no-state")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "15 intact, 0 broken" in result.stdout
    assert (
        "every stored row checked: 74 events of 11 invocations, 4 effects and 0 cancel "
        "requests; 0 snapshots"
    ) in result.stdout


def test_audit_verify_recomputes_the_log_head_the_fixture_had(fixture_store: Restored) -> None:
    lines = fixture_store.json_lines("audit", "verify", "--no-state")
    [log] = [line for line in lines if line["kind"] == "log"]
    assert (log["size"], log["head"]) == (74, LOG_HEADS[fixture_store.backend])


def test_audit_verify_checks_each_fork_against_its_source(fixture_store: Restored) -> None:
    lines = fixture_store.json_lines("audit", "verify", "--no-state")
    forks = {line["id"]: line["provenance"] for line in lines if line.get("forked_from")}
    assert forks == {"fx2-fork": "verified", "fx2-fork-paused": "verified"}
    alone = fixture_store.json_lines("audit", "verify", "fx2-fork", "--no-state")
    assert all(line["intact"] for line in alone if "id" in line)  # the reused write too


def test_replay_check_finds_every_history_identical_and_writes_nothing(
    fixture_store: Restored,
) -> None:
    """With the unchanged agents: every history re-drives to its trajectory, each decision's
    digests compared (no "no digest recorded" note), and nothing is appended to the store
    nor sent to the refund desk (its file is never made)."""
    [report] = fixture_store.json_lines("replay", "--all", "--check", "--agent", AGENT_REF)
    by_id = {r["invocation_id"]: r for r in report["results"]}
    assert set(by_id) == set(LISTED)
    for invocation_id, result in by_id.items():
        assert result["identical"], (invocation_id, result["divergences"])
        assert not any("no digest recorded" in note for note in result["notes"]), invocation_id
    assert by_id["fx2-killed"]["notes"] == [
        "the recorded run has not ended: compared up to its step 1"
    ]
    [log] = [
        line
        for line in fixture_store.json_lines("audit", "verify", "--no-state")
        if line["kind"] == "log"
    ]
    assert (log["size"], log["head"]) == (74, LOG_HEADS[fixture_store.backend])
    assert not fixture_store.desk.path.exists()


def test_resume_completes_the_killed_invocation_with_its_refund_made_once(
    restored: Restored,
) -> None:
    [outcome] = restored.json_lines("resume", "fx2-killed", "--agent", AGENT_REF)
    assert (outcome["reason"], outcome["answer"], outcome["steps"]) == (
        "completed",
        "refunded A-3: rf-A-3-60",
        2,
    )
    assert restored.desk.refunds() == [(KILLED_EFFECT, "A-3", 60)]
    # Asked first, the desk had never seen the key: the one request is the second attempt.
    assert restored.desk.attempts() == [(KILLED_EFFECT, "A-3", 2)]


def test_approve_continues_the_paused_refund_to_its_end(restored: Restored) -> None:
    [outcome] = restored.json_lines(
        "approve", "fx2-approval", "--digest", APPROVAL_DIGEST, "--by", "alice",
        "--agent", AGENT_REF,
    )  # fmt: skip
    assert (outcome["reason"], outcome["answer"]) == ("completed", "refunded A-2: rf-A-2-250")
    assert [(order, attempt) for _, order, attempt in restored.desk.attempts()] == [("A-2", 1)]


def test_approve_of_the_paused_fork_makes_the_repeated_refund_under_a_new_key(
    restored: Restored,
) -> None:
    [outcome] = restored.json_lines(
        "approve", "fx2-fork-paused", "--digest", FORK_APPROVAL_DIGEST, "--by", "alice",
        "--agent", AGENT_REF,
    )  # fmt: skip
    assert (outcome["reason"], outcome["answer"]) == ("completed", "refunded A-1: rf-A-1-40")
    [(key, order, amount)] = restored.desk.refunds()
    assert (order, amount) == ("A-1", 40)
    assert key != COMPLETED_EFFECT


def test_wake_lets_the_sleeping_reminder_go_out_and_the_run_end(restored: Restored) -> None:
    woken = restored.cli("wake", "fx2-sleeping", "--by", "ops", "--agent", AGENT_REF, "--json")
    assert woken.returncode == 0, woken.stdout + woken.stderr
    [outcome] = restored.json_lines("resume", "fx2-sleeping", "--agent", AGENT_REF)
    assert (outcome["reason"], outcome["answer"]) == ("completed", "reminded ann")
    types = [r["type"] for r in restored.json_lines("history", "fx2-sleeping")]
    assert types[4:] == ["SleepEnded", "ResultsCommitted", "DecisionProposed", "Terminated"]


def test_audit_verify_passes_once_the_fixture_invocations_are_continued(
    restored: Restored,
) -> None:
    """New events chain onto the ones 0.2.0 wrote."""
    assert restored.cli("resume", "fx2-killed", "--agent", AGENT_REF).returncode == 0
    approved = restored.cli(
        "approve", "fx2-approval", "--digest", APPROVAL_DIGEST, "--by", "alice",
        "--agent", AGENT_REF,
    )  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    result = restored.cli("audit", "verify", "--no-state")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
