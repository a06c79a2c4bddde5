"""Replay: recorded invocations re-driven under a (changed) agent, calling nothing.

Every test runs a recorded invocation for real first (a payment service counts its
calls), then replays it through ``Runtime.replay`` or ``loop-actors replay``: the
service must see no call, the source store no new row, and the report must name the
departure the loop's change caused, by kind and step.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.replay import DivergenceKind
from loop_actors import Agent, Budget, Runtime, ScriptedModel, UsageError, tool
from loop_actors.agent.tools import Tool
from loop_actors.cli import main
from loop_actors.runtime.replay import ReplayFilter, ReplayReport
from tests.support.fixture_stores import restore_sqlite

REPO = Path(__file__).resolve().parents[2]

SCRIPT: list[dict[str, Any]] = [
    {"kind": "tool_calls", "calls": [{"id": "c1", "name": "lookup", "arguments": {"q": "a-1"}}]},
    {"kind": "tool_calls", "calls": [{"id": "c2", "name": "pay", "arguments": {"amount": 40}}]},
    {"kind": "tool_calls", "calls": [{"id": "c3", "name": "lookup", "arguments": {"q": "a-2"}}]},
    {"kind": "final", "answer": "paid 40"},
]


class Service:
    """A payment service and a lookup that count every call they receive."""

    def __init__(self) -> None:
        self.charges: list[int] = []
        self.lookups: list[str] = []

    def tools(self, *, pay_needs_approval: bool = False, lookup_doc: str = "") -> list[Tool]:
        def lookup(q: str) -> str:
            self.lookups.append(q)
            return q.upper()

        lookup.__doc__ = lookup_doc or "Look an order up."

        def pay(amount: int) -> dict[str, str]:
            """Charge the customer."""
            self.charges.append(amount)
            return {"receipt": f"r-{len(self.charges)}"}

        return [
            tool(lookup),
            tool(effect="write", requires_approval=pay_needs_approval)(pay),
        ]

    @property
    def calls(self) -> int:
        return len(self.charges) + len(self.lookups)


def agent_of(service: Service, *, max_steps: int = 10, **options: Any) -> Agent:
    tool_options = {k: options.pop(k) for k in ("pay_needs_approval", "lookup_doc") if k in options}
    return Agent(
        "payer",
        ScriptedModel(SCRIPT),
        service.tools(**tool_options),
        Budget(max_steps=max_steps),
        **options,
    )


async def recorded(url: str, agent: Agent, goal: str = "refund A-1") -> str:
    async with Runtime(url) as runtime:
        outcome = await runtime.run(agent, goal)
    return outcome.invocation_id


async def replay(url: str, agent: Agent, ids: list[str], **options: Any) -> ReplayReport:
    async with Runtime(url) as runtime:
        return await runtime.replay(agent, ids, **options)


def rows(path: Path) -> int:
    with closing(sqlite3.connect(path)) as connection:
        return int(connection.execute("SELECT COUNT(*) FROM stored_events").fetchone()[0])


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "source.db"
    return path, f"sqlite:///{path}"


async def test_a_max_steps_run_replays_identically_under_its_own_agent(
    store: tuple[Path, str],
) -> None:
    path, url = store
    service = Service()
    with trio.fail_after(30):
        iid = await recorded(url, agent_of(service, max_steps=2))
        before_calls, before_rows = service.calls, rows(path)
        report = await replay(url, agent_of(service, max_steps=2), [iid])
    (result,) = report.results
    assert result.identical, result.divergences
    assert (result.recorded, result.replayed) == ("max_steps", "max_steps")
    assert report.identical
    assert report.endings() == []
    assert service.calls == before_calls  # the service saw no call
    assert rows(path) == before_rows  # nothing written to the source store


async def test_a_larger_step_budget_diverges_where_the_recorded_run_stopped(
    store: tuple[Path, str],
) -> None:
    _, url = store
    service = Service()
    with trio.fail_after(30):
        iid = await recorded(url, agent_of(service, max_steps=2))
        before = service.calls
        report = await replay(url, agent_of(service, max_steps=10), [iid])
    (result,) = report.results
    assert not result.identical
    first = result.first
    assert first is not None
    assert (first.kind, first.step) == (DivergenceKind.PAST_RECORDING, 3)
    assert result.past_recording
    assert result.replayed is None
    assert report.endings() == [("max_steps", "past_recording", 1)]
    assert service.calls == before


async def test_a_smaller_step_budget_stops_before_a_call_the_recorded_run_made(
    store: tuple[Path, str],
) -> None:
    _, url = store
    service = Service()
    with trio.fail_after(30):
        iid = await recorded(url, agent_of(service))
        report = await replay(url, agent_of(service, max_steps=2), [iid])
    first = report.results[0].first
    assert first is not None
    assert (first.kind, first.step) == (DivergenceKind.STOPPED_BEFORE_CALL, 3)
    assert "lookup" in first.detail
    assert report.endings() == [("completed", "max_steps", 1)]


async def test_a_committed_write_that_now_needs_approval_reports_the_pause(
    store: tuple[Path, str],
) -> None:
    _, url = store
    service = Service()
    with trio.fail_after(30):
        iid = await recorded(url, agent_of(service))
        charged = list(service.charges)
        report = await replay(url, agent_of(service, pay_needs_approval=True), [iid])
        assumed = await replay(
            url, agent_of(service, pay_needs_approval=True), [iid], assume_approved=True
        )
    first = report.results[0].first
    assert first is not None
    assert (first.kind, first.step) == (DivergenceKind.APPROVAL_REQUIRED, 2)
    assert report.results[0].replayed == "approval_required"
    # Approved by the replay itself, the run goes on to its recorded end.
    kinds = [d.kind for d in assumed.results[0].divergences]
    assert kinds[0] is DivergenceKind.APPROVAL_REQUIRED
    assert assumed.results[0].replayed == "completed"
    assert service.charges == charged  # never charged again


async def test_a_changed_tool_description_is_a_model_input_change(
    store: tuple[Path, str],
) -> None:
    _, url = store
    service = Service()
    with trio.fail_after(30):
        iid = await recorded(url, agent_of(service))
        report = await replay(url, agent_of(service, lookup_doc="Find an order by id."), [iid])
    (result,) = report.results
    first = result.first
    assert first is not None
    assert (first.kind, first.step) == (DivergenceKind.MODEL_INPUT_CHANGED, 1)
    assert "lookup" in first.detail
    # Not a stop: the loop did the same, and the ending is the recorded one.
    assert result.replayed == result.recorded == "completed"


async def test_a_policy_that_refuses_the_write_is_reported_at_its_step(
    store: tuple[Path, str],
) -> None:
    _, url = store
    service = Service()

    def no_payments(request: Any) -> bool:
        return bool(request.tool != "pay")

    with trio.fail_after(30):
        iid = await recorded(url, agent_of(service))
        report = await replay(url, agent_of(service, policy=no_payments), [iid])
    first = report.results[0].first
    assert first is not None
    assert (first.kind, first.step) == (DivergenceKind.REFUSED_BY_POLICY, 2)


async def test_a_verifier_that_refuses_the_final_answer_is_reported(
    store: tuple[Path, str],
) -> None:
    _, url = store
    service = Service()

    def refuse(answer: str, turns: Any) -> str:
        return "no receipt quoted"

    with trio.fail_after(30):
        iid = await recorded(url, agent_of(service))
        report = await replay(url, agent_of(service, verifier=refuse), [iid])
    first = report.results[0].first
    assert first is not None
    assert (first.kind, first.step) == (DivergenceKind.FINAL_ANSWER_REFUSED, 4)


async def test_a_recorded_approval_is_given_again_so_the_same_agent_replays_identically(
    store: tuple[Path, str],
) -> None:
    _, url = store
    service = Service()
    agent = agent_of(service, pay_needs_approval=True)
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            paused = await runtime.run(agent, "refund A-1")
            assert paused.digest is not None
            await runtime.approve(paused.invocation_id, digest=paused.digest, by="ops")
            done = await runtime.resume(paused.invocation_id, agent)
        assert done.reason == "completed"
        charged = list(service.charges)
        report = await replay(url, agent, [paused.invocation_id])
    assert report.results[0].identical, report.results[0].divergences
    assert service.charges == charged


async def test_where_keeps_only_the_invocations_that_meet_it(store: tuple[Path, str]) -> None:
    """Bad input tried: an unknown condition, a condition without '=', an unknown reason."""
    _, url = store
    service = Service()
    with trio.fail_after(30):
        short = await recorded(url, agent_of(service, max_steps=2), "short")
        await recorded(url, agent_of(service), "full")
        async with Runtime(url) as runtime:
            report = await runtime.replay(
                agent_of(service),
                every=True,
                where=ReplayFilter.parse("reason=max_steps,agent=payer"),
            )
    assert [r.invocation_id for r in report.results] == [short]
    for bad in ("colour=red", "reason", "reason=sleepy"):
        with pytest.raises(UsageError):
            ReplayFilter.parse(bad)


def _write_agents(folder: Path) -> None:
    (folder / "replay_agents.py").write_text(
        textwrap.dedent(
            f"""
            import os
            from loop_actors import Agent, Budget, ScriptedModel, tool

            SCRIPT = {SCRIPT!r}

            def _called(what):
                with open(os.environ["REPLAY_CALLS"], "a") as calls:
                    calls.write(what + "\\n")

            @tool
            def lookup(q: str) -> str:
                "Look an order up."
                _called("lookup " + q)
                return q.upper()

            @tool(effect="write")
            def pay(amount: int) -> dict:
                "Charge the customer."
                _called(f"pay {{amount}}")
                return {{"receipt": "r-1"}}

            short = Agent("payer", ScriptedModel(SCRIPT), [lookup, pay], Budget(max_steps=2))
            roomy = Agent("payer", ScriptedModel(SCRIPT), [lookup, pay], Budget(max_steps=10))
            """
        )
    )


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOP_ACTORS_")}
    env["PYTHONPATH"] = f"{folder}{os.pathsep}{REPO}"
    env["REPLAY_CALLS"] = str(folder / "calls.log")
    return subprocess.run(
        [sys.executable, "-m", "loop_actors", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_replay_command_exits_0_identical_4_diverged_and_prints_the_report(
    tmp_path: Path,
) -> None:
    _write_agents(tmp_path)
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    ran = _cli(tmp_path, "run", "replay_agents:short", "--goal", "g", "--json", "--db", db)
    assert ran.returncode == 4, ran.stderr  # max_steps
    iid = json.loads(ran.stdout)["invocation_id"]
    calls = (tmp_path / "calls.log").read_text()
    assert calls == "lookup a-1\npay 40\n"
    same = _cli(tmp_path, "replay", iid, "--agent", "replay_agents:short", "--db", db)
    assert same.returncode == 0, same.stderr
    assert "1 replayed: 1 identical, 0 diverge" in same.stdout
    changed = _cli(
        tmp_path, "replay", "--all", "--agent", "replay_agents:roomy", "--db", db, "--json"
    )
    assert changed.returncode == 4, changed.stderr
    document = json.loads(changed.stdout)
    assert document["identical"] is False
    assert document["diverged"] == 1
    (result,) = document["results"]
    assert result["divergences"][0]["kind"] == "past_recording"
    assert result["divergences"][0]["step"] == 3
    assert (tmp_path / "calls.log").read_text() == calls  # the replays called nothing
    assert document["endings"] == [
        {"recorded": "max_steps", "replayed": "past_recording", "count": 1}
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent", "replay_agents:short"], "name the invocations"),
        (["x", "--all", "--agent", "replay_agents:short"], "not both"),
        (["x", "--agent", "replay_agents:short", "--where", "colour=red"], "unknown condition"),
        (["x", "--agent", "nosuch:agent"], "cannot import"),
        (["x", "--agent", "replay_agents:short", "--match", "fuzzy"], "invalid choice"),
        (["x", "--agent", "replay_agents:short", "--into", "ftp://x"], ""),
    ],
)
def test_replay_usage_errors_exit_2_and_write_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    """Bad input tried: no ids, ids and --all, a bad --where, a missing agent, a bad --match
    and a malformed --into URL."""
    _write_agents(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "none.db"
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(["replay", *args, "--db", f"sqlite:///{db}"]))
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not db.exists()


def test_the_stores_written_before_replay_under_check(tmp_path: Path) -> None:
    """``replay --check`` with the fixture's unchanged agent on the store written by 0.1.0.

    Its histories predate the model-input digests: each says so in a note, and every
    one that ran a step replays to its recorded trajectory. The refund desk is never
    called (its file is never made).
    """
    path = tmp_path / "fixture.db"
    url = restore_sqlite(REPO / "tests" / "fixtures" / "store-0.1.0.sql", path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOP_ACTORS_")}
    desk = tmp_path / "desk.db"
    env["FIXTURE_DESK_DB"] = str(desk)
    before = rows(path)
    result = subprocess.run(
        [sys.executable, "-m", "loop_actors", "replay", "--all", "--check", "--json",
         "--agent", "tests.fixture_agents:agent", "--db", url],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode in (0, 4), result.stderr
    document = json.loads(result.stdout)
    by_id = {r["invocation_id"]: r for r in document["results"]}
    for iid in ("fx-completed", "fx-cannot", "fx-long", "fx-approval", "fx-clarify"):
        assert by_id[iid]["identical"], (iid, by_id[iid]["divergences"])
        assert any("no digest recorded" in note for note in by_id[iid]["notes"])
    assert rows(path) == before
    assert not desk.exists()


async def test_the_stores_written_by_0_2_0_replay_identically_with_their_digests(
    tmp_path: Path,
) -> None:
    """``Runtime.replay(check=True)`` with the unchanged agent on the store written by 0.2.0.

    Every history replays to its recorded trajectory with its model-input digests
    compared (no note says otherwise): the children and the handoff's target each under
    the agent that ran it (the desk's sub-agent and handoff), the forks from their
    origin, the sleeps woken as they were. No row is added and the desk never called.
    """
    path = tmp_path / "fixture.db"
    url = restore_sqlite(REPO / "tests" / "fixtures" / "store-0.2.0.sql", path)
    desk = tmp_path / "desk.db"
    before = rows(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FIXTURE_DESK_DB", str(desk))
        from tests.fixture_agents_0_2_0 import REMINDED, agent

        with trio.fail_after(120):
            async with Runtime(url) as runtime:
                report = await runtime.replay(agent, every=True, check=True)
    assert len(report.results) == 11
    assert report.identical, [(r.invocation_id, r.divergences) for r in report.results]
    assert {r.invocation_id: r.notes for r in report.results if r.notes} == {
        "fx2-killed": ["the recorded run has not ended: compared up to its step 1"]
    }
    assert rows(path) == before
    assert not desk.exists()
    assert REMINDED == []  # the sleeping reminder's function never ran


async def test_a_removed_tool_is_a_catalogue_change_under_check_and_a_refused_proposal(
    store: tuple[Path, str],
) -> None:
    _, url = store
    service = Service()
    with trio.fail_after(30):
        iid = await recorded(url, agent_of(service))
        lookup_only = Agent(
            "payer", ScriptedModel(SCRIPT), service.tools()[:1], Budget(max_steps=10)
        )
        report = await replay(url, lookup_only, [iid], check=True)
    kinds = [(d.kind, d.step) for d in report.results[0].divergences]
    assert (DivergenceKind.CATALOGUE_CHANGED, None) in kinds
    assert (DivergenceKind.SETTINGS_CHANGED, None) in kinds  # the approval rules lost pay
    assert kinds[-1] == (DivergenceKind.PROPOSAL_REFUSED, 2)


async def test_a_smaller_context_limit_is_a_compaction_change(store: tuple[Path, str]) -> None:
    _, url = store
    service = Service()
    with trio.fail_after(30):
        iid = await recorded(url, agent_of(service))
        report = await replay(url, agent_of(service, context_limit=300, keep_recent_turns=1), [iid])
    kinds = [d.kind for d in report.results[0].divergences]
    assert DivergenceKind.COMPACTION_CHANGED in kinds


async def test_a_lenient_replay_still_stops_where_the_run_becomes_another(
    store: tuple[Path, str],
) -> None:
    """A policy refusing the write, then a verifier refusing the answer: both modes report
    the refusal at step 2 and stop there (lenient goes on only past drift in the calls)."""
    _, url = store
    service = Service()

    def no_payments(request: Any) -> bool:
        return bool(request.tool != "pay")

    with trio.fail_after(30):
        iid = await recorded(url, agent_of(service))
        changed = agent_of(service, policy=no_payments, verifier=lambda answer, turns: "no")
        strict = await replay(url, changed, [iid])
        lenient = await replay(url, changed, [iid], match="lenient")
    assert [d.kind for d in strict.results[0].divergences] == [DivergenceKind.REFUSED_BY_POLICY]
    assert [d.kind for d in lenient.results[0].divergences] == [DivergenceKind.REFUSED_BY_POLICY]
    assert lenient.match == "lenient"


async def test_a_bad_match_and_no_invocations_are_usage_errors(store: tuple[Path, str]) -> None:
    """Bad input tried: an unknown match, no ids without every, a thing that is no Agent."""
    _, url = store
    service = Service()
    with trio.fail_after(30):
        iid = await recorded(url, agent_of(service))
        async with Runtime(url) as runtime:
            with pytest.raises(UsageError, match="strict or lenient"):
                await runtime.replay(agent_of(service), [iid], match="fuzzy")
            with pytest.raises(UsageError, match="name the invocations"):
                await runtime.replay(agent_of(service))
            with pytest.raises(UsageError, match="needs an Agent"):
                await runtime.replay("payer", [iid])  # type: ignore[arg-type]
