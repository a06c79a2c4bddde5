"""Settling an effect by hand: ``loop-actors effects resolve`` and ``Runtime.resolve_effect``.

The story of issue 13: a write tool without ``reconcile`` (an MCP write not marked
idempotent) times out, so nobody knows whether the write happened; the invocation
pauses ``reconciliation_required`` and no sweep can settle the effect. A person
says what became of it, the ledger records who and why, and the invocation resumes
with that outcome as the call's result.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.decisions import EffectStatus
from aggregates.effect import (
    Effect,
    EffectResolvedByHand,
    InvalidResolutionError,
    Resolution,
    Settler,
    who_settles,
)
from aggregates.errors import IllegalTransitionError
from aggregates.invocation import Phase
from loop_actors import (
    Agent,
    EffectNotFoundError,
    EffectResolutionError,
    Runtime,
    ScriptedModel,
    TerminalReason,
    UsageError,
)
from loop_actors.store.store import EventStore
from tests.support.cli import run_cli
from tests.support.effects import (
    AGENTS,
    INVOCATION,
    KEY,
    api_agent,
    cli,
    ledger,
    paused_project,
    paused_run,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def db_url(store_url: str) -> str:
    """This module's stores: each test runs on a SQLite file and on PostgreSQL."""
    return store_url


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return paused_project(tmp_path / "project")


def results_committed(project: Path) -> list[dict[str, Any]]:
    history = cli(project, "history", INVOCATION, "--json")
    records = [json.loads(line) for line in history.stdout.splitlines()]
    return [r["data"] for r in records if r["type"] == "ResultsCommitted"]


def open_effects(project: Path, *extra: str) -> list[dict[str, Any]]:
    listing = cli(project, "effects", "--json", *extra)
    assert listing.returncode == 0, listing.stderr
    return [json.loads(line) for line in listing.stdout.splitlines()]


# --------------------------------------------------------------------------- the CLI


def test_resume_after_resolving_committed_completes_with_the_receipt_as_the_calls_result(
    project: Path,
) -> None:
    resolved = cli(
        project, "effects", "resolve", KEY, "--committed", "--receipt", '{"id":1}', "--by", "alice"
    )
    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stdout.splitlines() == [
        f"resolved {KEY} committed by alice (invocation {INVOCATION}, tool write_file)",
        f"resume it to continue: loop-actors resume {INVOCATION} --agent MODULE:ATTR",
    ]

    resumed = cli(project, "resume", INVOCATION, "--agent", "agents:writer")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[:2] == ["completed", '{"output": {"id": 1}}']
    ((result,),) = [data["results"] for data in results_committed(project)]
    assert (result["output"], result["effect_status"]) == ({"id": 1}, "reconciled")


def test_the_ledger_records_who_settled_the_effect_and_why_and_its_chain_stays_whole(
    project: Path,
) -> None:
    resolved = cli(
        project,
        "effects",
        "resolve",
        KEY,
        "--committed",
        "--receipt",
        '{"id":1}',
        "--reason",
        "the file is on the server",
        "--by",
        "alice",
    )
    assert resolved.returncode == 0, resolved.stderr
    records = ledger(project)
    assert [r["type"] for r in records] == [
        "EffectPrepared",
        "EffectDispatched",
        "EffectOutcomeUnknown",
        "EffectResolvedByHand",
    ]
    assert records[-1]["data"] == {
        "by": "alice",
        "reason": "the file is on the server",
        "receipt": {"id": 1},
        "resolution": "committed",
    }
    verified = cli(project, "audit", "verify", INVOCATION)
    assert verified.returncode == 0, verified.stdout


def test_resume_after_resolving_rejected_gives_the_model_a_rejected_result_with_the_reason(
    project: Path,
) -> None:
    resolved = cli(
        project,
        "effects",
        "resolve",
        KEY,
        "--rejected",
        "--reason",
        "no file /a on the server",
        "--by",
        "bob",
    )
    assert resolved.returncode == 0, resolved.stderr
    assert ledger(project)[-1]["data"] == {
        "by": "bob",
        "reason": "no file /a on the server",
        "resolution": "rejected",
    }
    resumed = cli(project, "resume", INVOCATION, "--agent", "agents:writer")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[1]) == {
        "error": "rejected",
        "message": "no file /a on the server",
    }


def test_resolving_with_the_agent_redacts_the_receipt_and_resumes_with_the_real_one(
    project: Path,
) -> None:
    resolved = cli(
        project,
        "effects",
        "resolve",
        KEY,
        "--committed",
        "--receipt",
        '{"id":1,"token":"s3cret"}',
        "--by",
        "alice",
        "--agent",
        "agents:writer",
    )
    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stderr == ""
    assert resolved.stdout.splitlines()[:3] == [
        f"resolved {KEY} committed by alice (invocation {INVOCATION}, tool write_file)",
        "completed",
        '{"output": {"id": 1, "token": "real"}}',
    ]
    assert ledger(project)[-1]["data"]["receipt"] == {"id": 1, "token": "[redacted]"}
    ((result,),) = [data["results"] for data in results_committed(project)]
    assert result["output"] == {"id": 1, "token": "[redacted]"}
    everything = (
        cli(project, "history", INVOCATION, "--json").stdout
        + cli(project, "history", KEY, "--json").stdout
    )
    assert "s3cret" not in everything


def test_resolving_without_the_agent_stores_the_receipt_as_given_and_says_so(
    project: Path,
) -> None:
    resolved = cli(
        project,
        "effects",
        "resolve",
        KEY,
        "--committed",
        "--receipt",
        '{"id":1,"token":"s3cret"}',
        "--by",
        "alice",
    )
    assert resolved.returncode == 0, resolved.stderr
    assert "stored as given" in resolved.stderr
    assert ledger(project)[-1]["data"]["receipt"] == {"id": 1, "token": "s3cret"}


def test_a_paused_write_without_reconcile_needs_a_person_once_the_agents_tools_are_known(
    project: Path,
) -> None:
    """Without ``--agent`` the read model cannot see the tools: a live invocation's is the sweeper's."""
    (row,) = open_effects(project)
    assert (row["effect_key"], row["needs"], row["invocation_ended"]) == (KEY, "sweeper", False)
    (row,) = open_effects(project, "--agent", "agents:writer")
    assert (row["effect_key"], row["needs"], row["agent"]) == (KEY, "person", "writer")
    (listed,) = [
        json.loads(line)
        for line in cli(
            project, "effects", "list", "--json", "--agent", "agents:writer"
        ).stdout.splitlines()
    ]
    assert listed == row


def test_reconcile_exits_5_for_an_effect_only_a_person_can_settle_and_0_once_it_is_resolved(
    project: Path,
) -> None:
    swept = cli(project, "reconcile", "--agent", "agents:writer")
    assert swept.returncode == 5, swept.stderr
    assert swept.stdout.splitlines() == [
        f"resumed {INVOCATION}: reconciliation_required",
        f"needs a person {KEY} (invocation {INVOCATION}): tool write_file has no reconcile "
        f"function; loop-actors effects resolve {KEY} --committed [--receipt JSON] | "
        "--rejected --reason TEXT --by NAME",
        "effects settled=0 open=1 invocations waiting=1",
    ]
    report = json.loads(cli(project, "reconcile", "--agent", "agents:writer", "--json").stdout)
    assert report["needs_person"] == [
        {
            "effect_key": KEY,
            "invocation_id": INVOCATION,
            "tool": "write_file",
            "why": "tool write_file has no reconcile function",
        }
    ]
    assert report["effects_waiting"] == 0

    assert cli(project, "effects", "resolve", KEY, "--committed", "--by", "a").returncode == 0
    swept = cli(project, "reconcile", "--agent", "agents:writer")
    # Nothing is open now, and the sweeper resumes the invocation it paused.
    assert (swept.returncode, swept.stdout.splitlines()) == (
        0,
        [f"resumed {INVOCATION}: completed", "effects settled=0 open=0 invocations waiting=0"],
    )


def test_a_cancelled_invocations_open_effect_needs_a_person_and_can_be_resolved(
    project: Path,
) -> None:
    cancelled = cli(project, "cancel", INVOCATION, "--by", "bob")
    assert cancelled.stdout.strip() == f"{INVOCATION}: ended"
    (row,) = open_effects(project)
    assert (row["effect_key"], row["needs"], row["invocation_ended"]) == (
        KEY,
        "reconcile_or_person",
        True,
    )
    (row,) = open_effects(project, "--agent", "agents:writer")  # write_file has no reconcile
    assert row["needs"] == "person"
    assert cli(project, "reconcile", "--agent", "agents:writer").returncode == 5

    resolved = cli(
        project, "effects", "resolve", KEY, "--rejected", "--reason", "not on disk", "--by", "bob"
    )
    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stdout.splitlines()[1] == "its invocation has ended: nothing to resume"
    assert open_effects(project) == []
    swept = cli(project, "reconcile", "--agent", "agents:writer")
    assert (swept.returncode, swept.stdout.splitlines()) == (
        0,
        ["effects settled=0 open=0 invocations waiting=0"],
    )


def test_resolving_an_effect_whose_invocation_may_still_be_running_is_refused(
    tmp_path: Path,
) -> None:
    """Bad input: an effect of an invocation that is neither paused nor ended (its process died)."""
    (tmp_path / "agents.py").write_text(AGENTS)
    crashed = run_cli(
        "run",
        "agents:writer",
        "--goal",
        "write /a",
        "--id",
        INVOCATION,
        cwd=tmp_path,
        db=f"sqlite:///{tmp_path / 'store.db'}",
        env={"LOOP_ACTORS_CRASH_AT": "after_dispatch_commit"},
    )
    assert crashed.returncode != 0
    refused = cli(tmp_path, "effects", "resolve", KEY, "--committed", "--by", "alice")
    assert refused.returncode == 2
    assert "may still be running" in refused.stderr
    assert [r["type"] for r in ledger(tmp_path)] == ["EffectPrepared", "EffectDispatched"]


@pytest.fixture(scope="module")
def shared_paused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One paused store for the refusals (each must leave it as it was)."""
    return paused_project(tmp_path_factory.mktemp("refusals") / "project")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("eff-unknown", "--committed", "--by", "a"), "no effect with key 'eff-unknown'"),
        ((KEY, "--committed", "--rejected", "--by", "a"), "not allowed with argument"),
        ((KEY, "--by", "a"), "one of the arguments --committed --rejected is required"),
        ((KEY, "--rejected", "--by", "a"), "a rejection needs a reason"),
        ((KEY, "--rejected", "--reason", "  ", "--by", "a"), "a rejection needs a reason"),
        ((KEY, "--committed"), "the following arguments are required: --by"),
        ((KEY, "--committed", "--by", " "), "say who settles the effect"),
        ((KEY, "--committed", "--receipt", "{id: 1}", "--by", "a"), "--receipt is not JSON"),
        ((KEY, "--committed", "--receipt", "NaN", "--by", "a"), "NaN is not JSON"),
        ((KEY, "--committed", "--receipt", '{"x":Infinity}', "--by", "a"), "Infinity is not"),
        ((KEY, "--committed", "--receipt", "[-Infinity]", "--by", "a"), "-Infinity is not"),
        ((KEY, "--committed", "--receipt", "1e400", "--by", "a"), "cannot be stored as JSON"),
        ((KEY, "--committed", "--receipt", '"\\ud800"', "--by", "a"), "cannot be stored"),
        (
            (KEY, "--rejected", "--reason", "no", "--receipt", "1", "--by", "a"),
            "a rejected write has no receipt",
        ),
        ((KEY, "--committed", "--by", "a", "--agent", "agents:other"), "of agent 'writer'"),
        ((KEY, "--committed", "--by", "a", "--agent", "agents:nothing"), "no attribute"),
    ],
)
def test_bad_resolutions_exit_2_with_one_clear_line_and_record_nothing(
    shared_paused: Path, args: tuple[str, ...], message: str
) -> None:
    """Bad inputs: unknown key, both/neither outcome, a rejection without (or with a blank)
    reason, no or a blank --by, malformed JSON, NaN, Infinity, -Infinity, a float out of
    range, a lone surrogate, a receipt for a rejection, another agent, an agent that
    does not load."""
    refused = cli(shared_paused, "effects", "resolve", *args)
    assert refused.returncode == 2
    assert message in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert [r["type"] for r in ledger(shared_paused)] == [
        "EffectPrepared",
        "EffectDispatched",
        "EffectOutcomeUnknown",
    ]


def test_resolving_an_effect_already_settled_is_refused_and_keeps_the_first_resolution(
    project: Path,
) -> None:
    """Bad input: a second resolution (the other outcome) of a settled effect."""
    assert cli(project, "effects", "resolve", KEY, "--committed", "--by", "alice").returncode == 0
    again = cli(project, "effects", "resolve", KEY, "--rejected", "--reason", "no", "--by", "bob")
    assert again.returncode == 2
    assert "is not open (status reconciled: committed by alice)" in again.stderr
    assert [r["type"] for r in ledger(project)][-1] == "EffectResolvedByHand"
    assert len(ledger(project)) == 4


def test_resolve_on_a_missing_database_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    """Bad input: a database file that does not exist."""
    refused = cli(tmp_path, "effects", "resolve", KEY, "--committed", "--by", "alice")
    assert refused.returncode == 2
    assert not (tmp_path / "store.db").exists()


# --------------------------------------------------------------------------- the Python API

SECRET_RECEIPT: dict[str, Any] = {"id": 7, "token": "s3cret"}


async def test_runtime_resolve_effect_then_resume_gives_the_model_the_real_receipt(
    db_url: str,
) -> None:
    seen: list[Any] = []
    agent = api_agent(seen)
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await paused_run(runtime, agent)
            resolved = await runtime.resolve_effect(
                KEY, committed=True, receipt=SECRET_RECEIPT, by="alice", agent=agent
            )
            outcome = await runtime.resume(INVOCATION, agent)
    assert (resolved.resolution, resolved.redacted, resolved.resumable) == (
        Resolution.COMMITTED,
        True,
        True,
    )
    assert resolved.receipt == {"id": 7, "token": "[redacted]"}
    assert outcome.reason is TerminalReason.COMPLETED
    # The model sees the real receipt (kept by this runtime); the store holds it redacted.
    assert [(r.output, r.effect_status) for r in seen] == [
        (SECRET_RECEIPT, EffectStatus.RECONCILED)
    ]
    effect = EventStore(db_url).get_effect(KEY)
    assert effect is not None
    assert (effect.receipt, effect.resolved_by) == ({"id": 7, "token": "[redacted]"}, "alice")


async def test_runtime_resolve_effect_rejected_then_resume_gives_a_rejected_result(
    db_url: str,
) -> None:
    seen: list[Any] = []
    agent = api_agent(seen)
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await paused_run(runtime, agent)
            resolved = await runtime.resolve_effect(
                KEY, rejected=True, reason="the server has no /a", by="bob"
            )
            outcome = await runtime.resume(INVOCATION, agent)
    assert (resolved.resolution, resolved.redacted) == (Resolution.REJECTED, None)
    assert outcome.reason is TerminalReason.COMPLETED
    ((error_class, message),) = [(r.error.error_class, r.error.message) for r in seen]
    assert (error_class.value, message) == ("rejected", "the server has no /a")


async def test_runtime_reconcile_reports_the_effect_that_needs_a_person(db_url: str) -> None:
    agent = api_agent([])
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await paused_run(runtime, agent)
            report = await runtime.reconcile(agent)
    assert [(n.effect_key, n.why) for n in report.needs_person] == [
        (KEY, "tool write_file has no reconcile function")
    ]
    assert (report.effects_open, report.effects_waiting) == (1, 0)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"committed": True, "rejected": True}, EffectResolutionError, "not both"),
        ({}, EffectResolutionError, "committed or rejected"),
        ({"committed": True, "by": ""}, EffectResolutionError, "say who settles"),
        ({"rejected": True}, EffectResolutionError, "a rejection needs a reason"),
        (
            {"rejected": True, "reason": "no", "receipt": {"id": 1}},
            EffectResolutionError,
            "a rejected write has no receipt",
        ),
        ({"committed": True, "receipt": float("nan")}, EffectResolutionError, "not JSON"),
        ({"committed": True, "receipt": {"x": float("inf")}}, EffectResolutionError, "JSON"),
        ({"committed": True, "receipt": (1, 2)}, EffectResolutionError, "would not read back"),
        ({"committed": True, "receipt": {1: "a"}}, EffectResolutionError, "would not read back"),
        ({"committed": True, "receipt": object()}, EffectResolutionError, "cannot be stored"),
        ({"committed": True, "key": "eff-nope"}, EffectNotFoundError, "no effect with key"),
        ({"committed": True, "agent": "other"}, EffectResolutionError, "not 'other'"),
        ({"committed": True, "agent": "tool-less"}, EffectResolutionError, "has no tool"),
        ({"committed": True, "agent": "not an agent"}, UsageError, "needs an Agent"),
    ],
)
async def test_runtime_resolve_effect_refuses_bad_input_with_a_typed_error_and_records_nothing(
    db_url: str, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    """Bad inputs: both/neither outcome, no name, a rejection without a reason or with a
    receipt, NaN, Infinity, a tuple, a non-string key, a non-JSON object, an unknown key,
    another agent, an agent without the tool, something that is not an agent."""
    agent = api_agent([])
    agents: dict[str, Any] = {
        "other": Agent("other", ScriptedModel([]), []),
        "tool-less": Agent("writer", ScriptedModel([])),
        "not an agent": "writer",
    }
    options = dict(options)
    key = options.pop("key", KEY)
    options.setdefault("by", "alice")
    if "agent" in options:
        options["agent"] = agents[options["agent"]]
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await paused_run(runtime, agent)
            with pytest.raises(error, match=message):
                await runtime.resolve_effect(key, **options)
    effect = EventStore(db_url).get_effect(KEY)
    assert effect is not None
    assert effect.status is EffectStatus.OUTCOME_UNKNOWN


async def test_runtime_resolve_effect_opens_the_store_when_it_is_not_open(db_url: str) -> None:
    agent = api_agent([])
    with trio.fail_after(30):
        await Runtime(db_url).run(agent, "write /a", invocation_id=INVOCATION)
        resolved = await Runtime(db_url).resolve_effect(KEY, committed=True, by="alice")
    assert (resolved.invocation_id, resolved.tool, resolved.receipt) == (
        INVOCATION,
        "write_file",
        None,
    )


# --------------------------------------------------------------------------- the ledger's rules

AT = datetime(2026, 1, 1, tzinfo=UTC)


def entry(*steps: str) -> Effect:
    effect = Effect.prepare(
        invocation_id="i", step=1, call_id="c", tool="t", arguments_digest="d", at=AT
    )
    for name in steps:
        match name:
            case "dispatch":
                effect.dispatch(at=AT)
            case "unknown":
                effect.mark_unknown("timeout", at=AT)
            case "commit":
                effect.commit({"id": 1}, at=AT)
            case "reject":
                effect.reject("no", at=AT)
    return effect


@pytest.mark.parametrize(
    ("steps", "legal"),
    [
        ((), False),  # prepared
        (("dispatch",), True),
        (("dispatch", "unknown"), True),
        (("dispatch", "commit"), False),
        (("dispatch", "reject"), False),
    ],
)
def test_only_an_open_effect_is_resolved_by_hand(steps: tuple[str, ...], legal: bool) -> None:
    effect = entry(*steps)
    before = effect.status
    if not legal:
        with pytest.raises(IllegalTransitionError, match="not open"):
            effect.resolve_by_hand(
                Resolution.COMMITTED, by="a", invocation_phase=Phase.TERMINATED, at=AT
            )
        assert effect.status is before
        return
    effect.resolve_by_hand(
        Resolution.COMMITTED, by="a", invocation_phase=Phase.TERMINATED, at=AT, receipt=1
    )
    assert (effect.status, effect.resolution, effect.receipt, effect.resolved_by) == (
        EffectStatus.RECONCILED,
        Resolution.COMMITTED,
        1,
        "a",
    )
    assert isinstance(effect.take_events()[-1], EffectResolvedByHand)


@pytest.mark.parametrize(
    ("phase", "legal"),
    [
        (Phase.DISPATCHED, False),
        (Phase.AWAITING_RECONCILIATION, True),
        (Phase.TERMINATED, True),
    ],
)
def test_an_effect_is_resolved_by_hand_only_while_its_invocation_cannot_be_running(
    phase: Phase, legal: bool
) -> None:
    effect = entry("dispatch", "unknown")
    if legal:
        effect.resolve_by_hand(
            Resolution.REJECTED, by="a", reason="r", invocation_phase=phase, at=AT
        )
        assert effect.status is EffectStatus.RECONCILED
    else:
        with pytest.raises(IllegalTransitionError, match="may still be running"):
            effect.resolve_by_hand(
                Resolution.REJECTED, by="a", reason="r", invocation_phase=phase, at=AT
            )
        assert effect.status is EffectStatus.OUTCOME_UNKNOWN


def test_a_person_cannot_say_not_found() -> None:
    """Bad input: ``not_found`` (only a resume dispatches a write again)."""
    effect = entry("dispatch", "unknown")
    with pytest.raises(InvalidResolutionError, match="committed or rejected"):
        effect.resolve_by_hand(
            Resolution.NOT_FOUND, by="a", invocation_phase=Phase.TERMINATED, at=AT
        )
    assert effect.status is EffectStatus.OUTCOME_UNKNOWN


@pytest.mark.parametrize(
    ("ended", "askable", "settler"),
    [
        (False, None, Settler.SWEEPER),
        (True, None, Settler.RECONCILE_OR_PERSON),
        (False, True, Settler.SWEEPER),
        (True, True, Settler.SWEEPER),
        (False, False, Settler.PERSON),
        (True, False, Settler.PERSON),
    ],
)
def test_who_settles_an_open_effect(ended: bool, askable: bool | None, settler: Settler) -> None:
    assert who_settles(invocation_ended=ended, service_can_be_asked=askable) is settler
