"""Read models: exactly once, rebuildable, live, and killable mid-batch."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.effect import EffectEvent, EffectPrepared
from aggregates.events import DomainEvent
from aggregates.invocation import EVENT_TYPES, InvocationEvent, Turn
from loop_actors import (
    Agent,
    Budget,
    Critic,
    Final,
    Handoff,
    ModelRequest,
    Plan,
    Planning,
    PlanStep,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    Usage,
    Wait,
    tool,
)
from loop_actors.store.store import EventStore
from projections import (
    InvocationStatus,
    TrajectoryProjection,
    build_trajectory,
    evolve_trajectory,
    list_open_effects,
    load_trajectory,
    metrics,
    plans_against_done,
)
from projections.trajectory import Trajectory, step_changed_by
from tests.support.cli import run_cli
from tests.support.read_model_runs import AGENTS, TABLES, behaviour, lookup, populate
from tests.support.read_model_stores import ReadModelDatabases, dump_tables

pytestmark = pytest.mark.slow


def dump(views: Path) -> dict[str, list[tuple[Any, ...]]]:
    connection = sqlite3.connect(views)
    try:
        return {
            table: sorted(connection.execute(f"SELECT * FROM {table}").fetchall(), key=repr)  # noqa: S608
            for table in TABLES
        }
    finally:
        connection.close()


def test_rebuild_equals_incremental_on_thousands_of_mixed_invocations(
    tmp_path: Path, views: ReadModelDatabases
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    store = EventStore(url)
    runner = views.open(store, "incremental", batch_size=97)  # built on an empty store
    total = 0
    for wave in range(3):
        trio.run(populate, url, total, 400)
        total += 400
        views.sync(store)
        reports = runner.catch_up()
        assert all(r.events > 0 for r in reports), wave
    incremental = dump_tables(runner, TABLES)
    runner.close()
    runner = views.open(store, "rebuilt")
    runner.rebuild()
    head = runner.head()
    assert [s.lag for s in runner.status()] == [0, 0, 0]
    assert dump_tables(runner, TABLES) == incremental
    runner.close()

    runner = views.open(store, "incremental")
    assert all(s.position == head for s in runner.status())
    by_reason = {row.group: row for row in metrics(runner, "reason")}
    assert by_reason["completed"].invocations == 400  # kinds 0 and 4
    assert by_reason["no_progress"].invocations == 200
    assert by_reason["no_progress"].repeated_plans == 0  # stopped before the repeat ran
    assert by_reason["invalid_decision"].invocations == 200
    assert by_reason["clarification_required"].invocations == 200
    assert by_reason["reconciliation_required"].invocations == 200
    assert by_reason["completed"].failed_calls == {"tool_failed": 200}
    assert by_reason["completed"].effects == {"committed": 200}
    assert by_reason["reconciliation_required"].effects == {"outcome_unknown": 200}
    assert sum(row.invocations for row in metrics(runner, "task-class")) == 1200
    assert len(list_open_effects(runner)) == 200
    trajectory = load_trajectory(runner, "inv-00004")
    assert trajectory is not None
    assert trajectory.steps[0].calls[0].effect_status == "committed"
    runner.close()
    store.close()


def cli(*args: str, cwd: Path, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"LOOP_ACTORS_CRASH_AT": crash_at} if crash_at else None
    return run_cli(*args, cwd=cwd, db="sqlite:///events.db", env=env)


def test_a_runner_killed_mid_batch_and_restarted_counts_nothing_twice(tmp_path: Path) -> None:
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 60)
    killed = cli(
        "projections", "catch-up", "metrics", "--batch-size", "50",
        cwd=tmp_path, crash_at="projection_batch_applied:3",
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    status = cli("projections", "status", "metrics", "--json", cwd=tmp_path)
    (position,) = [json.loads(line)["position"] for line in status.stdout.splitlines()]
    head = json.loads(status.stdout)["head"]
    assert position == 100  # two whole batches; the third died with its transaction
    assert head > 100

    resumed = cli("projections", "catch-up", "--batch-size", "50", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    incremental = dump(tmp_path / "events.views.db")
    rebuilt = cli("projections", "rebuild", cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert dump(tmp_path / "events.views.db") == incremental
    by_reason = json.loads(
        cli("metrics", "--by", "agent", "--json", cwd=tmp_path).stdout.splitlines()[0]
    )
    assert by_reason["invocations"] == 30


async def test_a_runtime_following_projections_keeps_them_caught_up(db_url: str) -> None:
    async with Runtime(db_url, follow_projections=True) as runtime:
        assert runtime.projections is not None
        for i in range(5):
            await runtime.run(AGENTS[0], "g", invocation_id=f"live-{i}")
        with trio.fail_after(10):
            # Every read model: the follower catches them up in turn, metrics after trajectory.
            while any(s.lag for s in runtime.projections.status()):  # noqa: ASYNC110 - polls a database
                await trio.sleep(0.01)
        rows = metrics(runtime.projections, "reason")
    assert [(r.group, r.invocations) for r in rows] == [("completed", 5)]


@pytest.mark.parametrize(
    "args",
    [
        ("show", "inv-00000"),
        ("list",),
        ("list", "--reason", "completed", "--agent", "agent-0"),
        ("metrics", "--by", "task-class"),
        ("effects",),
        ("projections", "status"),
    ],
)
def test_read_model_commands_print_json_lines(tmp_path: Path, args: tuple[str, ...]) -> None:
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 12)
    result = cli(*args, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines
    text = cli(*args, cwd=tmp_path)
    assert text.returncode == 0
    assert text.stdout.strip()


def test_list_filters_by_reason_and_agent(tmp_path: Path) -> None:
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 12)
    result = cli("list", "--reason", "no_progress", "--json", cwd=tmp_path)
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert {r["reason"] for r in rows} == {"no_progress"}
    assert len(rows) == 2


def test_show_of_an_unknown_invocation_is_a_usage_error(tmp_path: Path) -> None:
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 2)
    result = cli("show", "nobody", cwd=tmp_path)
    assert result.returncode == 2
    assert "nobody" in result.stderr


def test_show_json_counts_the_invocations_events(tmp_path: Path) -> None:
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 1)
    shown = json.loads(cli("show", "inv-00000", "--json", cwd=tmp_path).stdout)
    history = cli("history", "inv-00000", "--json", cwd=tmp_path).stdout.splitlines()
    assert shown["events"] == len(history) > 0


# --------------------------------------------------------------------------- one fold
# `loop-actors demo` prints build_trajectory(events); `loop-actors show` prints what the
# trajectory read model stored. Both come from evolve_trajectory: these tests hold the
# read model to the fold of each invocation's events, for every kind of history.


@tool(effect="write", requires_approval=lambda arguments: arguments["amount"] > 100)
async def refund(amount: int) -> str:
    """Refund an amount; above 100 a person must approve it."""
    return f"refunded {amount}"


def refunds(request: ModelRequest) -> Final | ToolCalls:
    """Two refunds, the first needing approval; then report the results."""
    if request.step == 1:
        return ToolCalls(
            calls=[
                ToolCall(id="r1", name="refund", arguments={"amount": 250}),
                ToolCall(id="r2", name="refund", arguments={"amount": 20}),
            ]
        )
    return Final(answer="; ".join(str(r.output or r.error) for r in request.results))


def careless(request: ModelRequest) -> Final | ToolCalls:
    """Answers wrongly first, then quotes the tool's output once refused (or criticised)."""
    if request.step == 1:
        return ToolCalls(calls=[ToolCall(id="k", name="lookup", arguments={"key": "x"})])
    last = request.turns[-1]
    if last.verification is not None or last.critique is not None:
        return Final(answer="the key is x")
    return Final(answer="no idea")


def quotes_the_key(answer: str, turns: list[Turn]) -> bool | str:
    return "x" in answer.split() or "the answer does not quote the key"


def reader(request: ModelRequest) -> Final | ToolCalls:
    """Five lookups, one a step (their results overflow the context), then an answer."""
    if request.step > 5:
        return Final(answer="read")
    key = f"page-{request.step}-" + "x" * 200
    return ToolCalls(calls=[ToolCall(id=f"p{request.step}", name="lookup", arguments={"key": key})])


REFUNDS = Agent("refunds", ScriptedModel(refunds), [refund])
ASKING = Agent("asking", ScriptedModel(behaviour(3)), [lookup])
VERIFIED = Agent("verified", ScriptedModel(careless), [lookup], verifier=quotes_the_key)
COMPACTED = Agent(
    "compacted",
    ScriptedModel(reader),
    [lookup],
    budget=Budget(max_repeated_plan=10),
    context_limit=1200,
    keep_recent_turns=1,
)


def answers_at_once(request: ModelRequest) -> Final:
    return Final(answer=f"done: {request.goal}")


def delegates(request: ModelRequest) -> Final | ToolCalls | Handoff:
    """Gives a goal to a child, then hands the conversation to another agent."""
    if request.step == 1:
        return ToolCalls(calls=[ToolCall(id="d", name="helper", arguments={"goal": "help"})])
    return Handoff(to="closer", reason="it closes tickets")


def waits_a_moment(request: ModelRequest) -> Final | Wait:
    """Waits until a time already past (it wakes at once), then answers."""
    if request.step == 1:
        return Wait(reason="the shop opens", until=datetime(2020, 1, 1, tzinfo=UTC))
    return Final(answer="bought")


WAITING = Agent("waiting", ScriptedModel(waits_a_moment), [])
REFLECTED = Agent(
    "reflected",
    ScriptedModel(careless),
    [lookup],
    # The critic sends the first answer back (its critique stands in for evidence), then
    # gives a reply that is no verdict, then accepts.
    critic=Critic(
        ScriptedModel(
            [
                {"kind": "revise", "critique": "quote the key"},
                {"kind": "fine"},
                {"kind": "accept"},
            ],
            usage=Usage(input_tokens=7, output_tokens=2),
        ),
        max_rounds=3,
    ),
)


def plans_a_refund(request: ModelRequest) -> Final | ToolCalls | Plan:
    """Plans one refund; makes it and one outside the plan; revises a denied plan."""
    match request.step:
        case 1:
            return Plan(steps=[PlanStep(tool="refund", arguments={"amount": 30})], summary="30")
        case 2 if request.turns[-1].approval == "denied by bob: too much":
            return Plan(steps=[PlanStep(tool="refund", arguments={"amount": 20})], summary="20")
        case 2:
            return ToolCalls(
                calls=[
                    ToolCall(id="p1", name="refund", arguments={"amount": 30}),
                    ToolCall(id="p2", name="refund", arguments={"amount": 10}),
                ]
            )
    return Final(answer="refunded")


PLANNING = Agent("planning", ScriptedModel(plans_a_refund), [refund], planning=Planning())
HELPER = Agent("helper", ScriptedModel(answers_at_once), [])
CLOSER = Agent("closer", ScriptedModel(answers_at_once), [])
DELEGATING = Agent("delegating", ScriptedModel(delegates), [HELPER.as_tool()], handoffs=[CLOSER])


async def every_kind_of_history(url: str) -> None:
    """The six kinds of `populate`, and approvals, answers, verification, compaction, cancel,
    a child invocation (its budget reserved and returned), a handoff and a wait."""
    await populate(url, 0, 6)
    async with Runtime(url) as runtime:
        paused = await runtime.run(REFUNDS, "refund", invocation_id="approval-waits")
        assert paused.digest is not None
        for name in ("approved-not-resumed", "approved", "denied", "cancelled-while-paused"):
            paused = await runtime.run(REFUNDS, "refund", invocation_id=name)
            assert paused.digest is not None
            if name.startswith("approved"):
                await runtime.approve(name, digest=paused.digest, by="alice", note="ok")
            elif name == "denied":
                await runtime.deny(name, by="bob", reason="no receipt")
            else:
                await runtime.request_cancel(name, by="ops", reason="not needed")
        await runtime.resume("approved", REFUNDS)
        await runtime.resume("denied", REFUNDS)
        await runtime.run(ASKING, "which", invocation_id="answered")
        await runtime.clarify("answered", answer="that one", by="carol")
        await runtime.resume("answered", ASKING)
        await runtime.run(VERIFIED, "key", invocation_id="verified")
        await runtime.run(COMPACTED, "read", invocation_id="compacted")
        await runtime.run(DELEGATING, "ticket", invocation_id="delegating")
        await runtime.run(WAITING, "bread", invocation_id="waited")
        await runtime.run(REFLECTED, "key", invocation_id="reflected")
        planned = await runtime.run(PLANNING, "refund", invocation_id="planned")
        assert planned.digest is not None
        await runtime.approve("planned", digest=planned.digest, by="alice")
        outside = await runtime.resume("planned", PLANNING)
        assert outside.digest is not None
        await runtime.approve("planned", digest=outside.digest, by="alice")
        await runtime.resume("planned", PLANNING)
        await runtime.run(PLANNING, "refund", invocation_id="plan-denied")
        await runtime.deny("plan-denied", by="bob", reason="too much")
        await runtime.resume("plan-denied", PLANNING)


def notification_log(store: EventStore) -> list[DomainEvent]:
    """Every event of the store, in the store's order."""
    recorder, mapper = store.app.recorder, store.app.mapper
    events: list[DomainEvent] = []
    while notifications := recorder.select_notifications(
        start=len(events), limit=500, inclusive_of_start=False
    ):
        events += [mapper.to_domain_event(n) for n in notifications]  # type: ignore[misc]
    return events


def histories(store: EventStore) -> dict[str, list[DomainEvent]]:
    """Each invocation's events with its writes' effect events, in the store's order."""
    log = notification_log(store)
    owner = {e.originator_id: e.invocation_id for e in log if isinstance(e, EffectPrepared)}
    found: dict[str, list[DomainEvent]] = {}
    for event in log:
        if isinstance(event, InvocationEvent):
            found.setdefault(event.originator_id, []).append(event)
        elif isinstance(event, EffectEvent):
            found[owner[event.originator_id]].append(event)
    return found


@pytest.fixture(scope="module")
def mixed_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mixed") / "events.db"
    trio.run(every_kind_of_history, f"sqlite:///{path}")
    return path


def test_the_histories_cover_every_way_a_trajectory_stands(mixed_store: Path) -> None:
    store = EventStore(f"sqlite:///{mixed_store}", create=False)
    try:
        every = histories(store)
    finally:
        store.close()
    folded = {i: build_trajectory(e) for i, e in every.items()}
    kinds = {type(event).__name__ for events in every.values() for event in events}
    # A new event type fails here until a history makes it and the fold decides what to show.
    # SettingsChanged (a resume told to use new settings) and LeaseAcquired (a worker took
    # it over) are only counted among the events.
    assert kinds >= {t.__name__ for t in EVENT_TYPES} - {"SettingsChanged", "LeaseAcquired"}
    assert {t.status for t in folded.values()} == set(InvocationStatus)
    assert folded["approved-not-resumed"].status is InvocationStatus.RUNNING
    assert folded["approval-waits"].reason == "approval_required"
    assert folded["inv-00005"].steps[0].calls[0].effect_status == "outcome_unknown"
    assert folded["denied"].steps[0].calls[0].status == "denied"
    assert folded["denied"].steps[0].approval == "denied by bob: no receipt"
    [plan] = plans_against_done(folded["planned"])
    assert plan.approval == "approved by alice"
    assert [(w.tool, w.arguments, w.made_at, w.status) for w in plan.writes] == [
        ("refund", {"amount": 30}, 2, "ok")
    ]
    assert [(w.call_id, w.arguments, w.approval) for w in plan.outside] == [
        ("p2", {"amount": 10}, "approved by alice")
    ]
    denied, revised = plans_against_done(folded["plan-denied"])
    assert denied.approval == "denied by bob: too much"
    assert revised.approval is None  # it waits
    assert folded["plan-denied"].reason == "plan_approval_required"


@pytest.mark.parametrize("batch_size", [1, 7, 500])
def test_the_read_model_holds_the_fold_of_each_invocations_events(
    mixed_store: Path, views: ReadModelDatabases, batch_size: int
) -> None:
    """What `show` reads equals what `demo` folds, whatever the batches cut."""
    store = EventStore(f"sqlite:///{mixed_store}", create=False)
    runner = views.open(store, "views", [TrajectoryProjection()], batch_size=batch_size)
    try:
        runner.catch_up()
        for invocation_id, events in histories(store).items():
            assert load_trajectory(runner, invocation_id) == build_trajectory(events), invocation_id
    finally:
        runner.close()
        store.close()


def test_the_trajectory_rows_do_not_depend_on_where_the_batches_cut(
    mixed_store: Path, views: ReadModelDatabases
) -> None:
    """Every stored column, started_position and the head's steps included, at any batch size."""
    store = EventStore(f"sqlite:///{mixed_store}", create=False)
    tables = TrajectoryProjection().tables()
    rows: list[dict[str, list[tuple[Any, ...]]]] = []
    try:
        for batch_size in (1, 7, 500):
            runner = views.open(
                store, f"views-{batch_size}", [TrajectoryProjection()], batch_size=batch_size
            )
            try:
                runner.catch_up()
                rows.append(dump_tables(runner, tables))
            finally:
                runner.close()
    finally:
        store.close()
    assert rows[0] == rows[1] == rows[2]


def test_each_event_changes_the_head_and_only_the_step_it_names(mixed_store: Path) -> None:
    """The fold's contract, on which the read model reads one step per event."""
    store = EventStore(f"sqlite:///{mixed_store}", create=False)
    try:
        every = histories(store)
    finally:
        store.close()
    for events in every.values():
        trajectory: Trajectory | None = None
        for event in events:
            after = evolve_trajectory(trajectory, event)
            before = trajectory.steps if trajectory else []
            assert len(before) <= len(after.steps) <= len(before) + 1
            for old, new in zip(before, after.steps, strict=False):
                if old == new:
                    continue
                if isinstance(event, EffectEvent):
                    assert event.originator_id in {c.effect_key for c in old.calls}
                else:
                    assert isinstance(event, InvocationEvent)
                    assert old.step == step_changed_by(event), type(event).__name__
            trajectory = after
