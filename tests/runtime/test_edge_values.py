"""Values at the edges: whatever a model, a tool or a service gives, the store stays readable.

Each test feeds one kind of bad value through the public API on a real SQLite file and
checks three things: the run ends with a typed outcome, what was stored is what ran (or
a typed stand-in, never ``null`` for NaN), and the invocation reads back and verifies.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from aggregates.invocation import DecisionProposed, ResultsCommitted
from loop_actors import (
    Agent,
    Budget,
    ErrorClass,
    ModelReply,
    ModelRequest,
    Reconciled,
    RejectionClass,
    Runtime,
    ScriptedModel,
    TerminalReason,
    Usage,
    UsageError,
    tool,
)
from loop_actors.store.store import EventStore
from tests.support.cli import CLI, cli_env, run_cli
from tests.support.replies import FINAL, calls
from tests.support.runs import assert_readable, drive


@tool
def echo(value: Any = None) -> Any:
    """Return what it is given."""
    return value


def rejections(events: list[Any]) -> list[Any]:
    return [e.rejection for e in events if isinstance(e, DecisionProposed) and e.rejection]


def results(events: list[Any]) -> list[Any]:
    return [r for e in events if isinstance(e, ResultsCommitted) for r in e.results]


# --------------------------------------------------------------------------- usage


@pytest.mark.parametrize(
    "usage",
    [
        Usage(cost=math.nan),
        Usage(cost=math.inf),
        Usage(latency_ms=-math.inf),
        Usage(input_tokens=500, output_tokens=-600),
        Usage(cost=-1.0),
    ],
    ids=["nan-cost", "inf-cost", "-inf-latency", "negative-tokens", "negative-cost"],
)
async def test_usage_that_cannot_be_recorded_ends_the_run_model_error(
    db_url: str, usage: Usage
) -> None:
    """Tried: NaN / +Infinity cost, -Infinity latency, -600 output tokens, a negative cost."""
    agent = Agent("a", ScriptedModel([FINAL], usage=usage))
    outcome, events = await drive(agent, db_url)
    assert outcome.reason is TerminalReason.MODEL_ERROR
    assert "usage that cannot be recorded" in (outcome.detail or "")
    assert not any(isinstance(e, DecisionProposed) for e in events)


async def test_negative_tokens_cannot_pay_back_a_token_budget(db_url: str) -> None:
    """Tried: 500 input / -600 output tokens a step under max_tokens=1000 (ran 6 steps before)."""
    model = ScriptedModel(
        [calls((f"c{i}", "echo", {"value": i})) for i in range(6)] + [FINAL],
        usage=Usage(input_tokens=500, output_tokens=-600),
    )
    agent = Agent("a", model, [echo], Budget(max_tokens=1000))
    outcome, _ = await drive(agent, db_url)
    assert outcome.reason is TerminalReason.MODEL_ERROR
    assert outcome.steps == 0


# --------------------------------------------------------------------------- proposals


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"value": math.nan}, "nan is not a finite number"),
        ({"value": [math.inf]}, "inf is not a finite number"),
        ({"value": "bad\ud800"}, "lone surrogate"),
        ({"value": {1, 2}}, "a set is not a JSON value"),
        ({"value": b"raw"}, "a bytes is not a JSON value"),
    ],
    ids=["nan", "inf", "surrogate", "set", "bytes"],
)
async def test_arguments_that_cannot_be_stored_are_rejected_and_the_model_told(
    db_url: str, arguments: dict[str, Any], problem: str
) -> None:
    """Tried: NaN, Infinity, a lone surrogate, a set and bytes in a call's arguments."""
    seen: list[ModelRequest] = []

    def script(request: ModelRequest) -> Any:
        seen.append(request)
        return calls(("c1", "echo", arguments)) if request.step == 1 else FINAL

    outcome, events = await drive(Agent("a", ScriptedModel(script), [echo]), db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    (rejection,) = rejections(events)
    assert rejection.rejection_class is RejectionClass.VALUE_INVALID
    assert problem in rejection.problems[0]
    assert rejection.raw["unstorable"] is True  # a stand-in, never JSON null
    assert seen[1].turns[0].rejection == rejection  # the model is shown why
    assert results(events) == []


async def test_arguments_as_json_text_with_nan_are_rejected(db_url: str) -> None:
    """Tried: the OpenAI adapter's path, arguments as JSON text holding NaN and 1e400."""
    model = ScriptedModel(
        [calls(("c1", "echo", '{"value": NaN}'), ("c2", "echo", '{"value": 1e400}')), FINAL]
    )
    outcome, events = await drive(Agent("a", model, [echo]), db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    (rejection,) = rejections(events)
    assert rejection.rejection_class is RejectionClass.SCHEMA_INVALID
    assert "not a finite number" in " ".join(rejection.problems)


async def test_a_tool_type_that_makes_infinity_from_text_is_refused(db_url: str) -> None:
    """Tried: "Infinity" given to a float parameter (pydantic turns it into inf)."""

    @tool
    def scale(factor: float) -> float:
        """Scale."""
        return factor

    model = ScriptedModel([calls(("c1", "scale", {"factor": "Infinity"})), FINAL])
    outcome, events = await drive(Agent("a", model, [scale]), db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    (rejection,) = rejections(events)
    assert rejection.rejection_class is RejectionClass.VALUE_INVALID


@pytest.mark.parametrize("depth", [65, 250, 5_000])
async def test_deeply_nested_arguments_are_rejected_at_validation(db_url: str, depth: int) -> None:
    """Tried: arguments nested 65, 250 (was accepted, then unreadable) and 5000 levels."""
    deep: Any = 1
    for _ in range(depth):
        deep = [deep]
    model = ScriptedModel([calls(("c1", "echo", {"value": deep})), FINAL])
    outcome, events = await drive(Agent("a", model, [echo]), db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    (rejection,) = rejections(events)
    assert rejection.rejection_class is RejectionClass.VALUE_INVALID
    assert "nested deeper than 64 levels" in rejection.problems[0]


@pytest.mark.parametrize("depth", [1_000, 100_000])
async def test_deep_json_text_does_not_escape_run_as_recursion_error(
    db_url: str, depth: int
) -> None:
    """Tried: a whole proposal, and arguments, as JSON text nested 1000 and 100000 levels."""
    text = "[" * depth + "]" * depth
    model = ScriptedModel(
        [{"kind": "tool_calls", "calls": [{"id": "c", "name": "echo", "arguments": text}]}]
    )
    outcome, _ = await drive(Agent("a", model, [echo], max_invalid_proposals=0), db_url)
    assert outcome.reason is TerminalReason.INVALID_DECISION
    whole = Agent("a", _TextModel(text), max_invalid_proposals=0)
    async with Runtime(db_url) as runtime:
        outcome = await runtime.run(whole, "g", invocation_id="whole")
    assert outcome.reason is TerminalReason.INVALID_DECISION
    (rejection,) = rejections(assert_readable(db_url, "whole"))
    assert rejection.rejection_class is RejectionClass.VALUE_INVALID
    assert set(rejection.raw) == {"unstorable", "problem", "size", "sha256"}


class _TextModel:
    """A model that answers one JSON text (or bytes) as its whole proposal."""

    def __init__(self, text: str | bytes) -> None:
        self.text = text

    async def decide(self, request: ModelRequest) -> ModelReply:
        return ModelReply(proposal=self.text)


@pytest.mark.parametrize(
    "proposal",
    [
        {"kind": "final", "answer": "lone \udc80 surrogate"},
        {"kind": "clarification", "question": "why\ud83d?"},
        '{"kind": "final", "answer": "\\ud800"}',
        b'{"kind": "final", "answer": "\xff"}',
    ],
    ids=["answer", "question", "escaped-in-text", "invalid-utf8-bytes"],
)
async def test_lone_surrogates_in_a_proposal_are_rejected_not_a_unicode_error(
    db_url: str, proposal: Any
) -> None:
    """Tried: lone surrogates in an answer, a question, a JSON escape; bytes not UTF-8."""
    model: Any = (
        _TextModel(proposal) if isinstance(proposal, str | bytes) else ScriptedModel([proposal])
    )
    outcome, events = await drive(Agent("a", model, max_invalid_proposals=0), db_url)
    assert outcome.reason is TerminalReason.INVALID_DECISION
    (rejection,) = rejections(events)
    assert rejection.rejection_class is RejectionClass.VALUE_INVALID


async def test_a_goal_with_a_lone_surrogate_is_a_usage_error_and_nothing_is_written(
    db_url: str,
) -> None:
    with pytest.raises(UsageError, match="goal cannot be stored"):
        await Runtime(db_url).run(Agent("a", ScriptedModel([FINAL])), "goal \udcff")


async def test_a_proposal_over_max_proposal_bytes_is_rejected_too_large_with_a_stand_in(
    db_url: str,
) -> None:
    """Tried: a 20 MB final answer under the 256 KB default limit, and a 2 KB one under 1 KB."""
    huge = {"kind": "final", "answer": "x" * 20_000_000}
    outcome, events = await drive(
        Agent("a", ScriptedModel([huge, FINAL]), max_invalid_proposals=1), db_url
    )
    assert outcome.reason is TerminalReason.COMPLETED
    (rejection,) = rejections(events)
    assert rejection.rejection_class is RejectionClass.TOO_LARGE
    assert rejection.raw["truncated"] is True
    assert rejection.raw["size"] > 20_000_000
    assert len(rejection.raw["head"]) == 2_000
    small = Agent(
        "a",
        ScriptedModel([{"kind": "final", "answer": "y" * 2_000}]),
        max_proposal_bytes=1_000,
        max_invalid_proposals=0,
    )
    async with Runtime(db_url) as runtime:
        outcome = await runtime.run(small, "g", invocation_id="small")
    assert outcome.reason is TerminalReason.INVALID_DECISION
    assert "over the limit of 1000" in (outcome.detail or "")


# --------------------------------------------------------------------------- tool outputs


@pytest.mark.parametrize(
    ("returned", "problem"),
    [
        ({"x": math.nan}, "nan is not a finite number"),
        ([-math.inf], "inf is not a finite number"),
        ("name\udcff", "lone surrogate"),
        (os.fsdecode(b"file-\xff.txt"), "lone surrogate"),
        (b"\xff\xfe", "not JSON-serialisable"),
        ({"n": 10**30}, "64-bit range"),
    ],
    ids=["nan", "-inf", "surrogate", "listdir-name", "bytes", "huge-int"],
)
async def test_an_output_that_cannot_be_stored_is_an_output_invalid_error(
    db_url: str, returned: Any, problem: str
) -> None:
    """Tried: NaN, -Infinity, a lone surrogate, an os.listdir name decoded with
    surrogateescape, bytes that are not UTF-8, an integer of 10**30."""

    @tool
    def produce() -> Any:
        """Return the bad value."""
        return returned

    model = ScriptedModel([calls(("c1", "produce", {})), FINAL])
    outcome, events = await drive(Agent("a", model, [produce]), db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = results(events)
    assert result.output is None
    assert result.error.error_class is ErrorClass.OUTPUT_INVALID
    assert problem in result.error.message


async def test_a_write_with_an_unstorable_output_is_committed_without_a_receipt(
    db_url: str,
) -> None:
    """Tried: a write tool returning NaN: the service did the write, its output is refused."""

    @tool(effect="write")
    def pay() -> Any:
        """Pay."""
        return {"amount": math.nan}

    outcome, events = await drive(
        Agent("a", ScriptedModel([calls(("w", "pay", {})), FINAL]), [pay]), db_url
    )
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = results(events)
    assert result.error.error_class is ErrorClass.OUTPUT_INVALID
    assert result.effect_status == "committed"
    ledger = EventStore(db_url).get_effect(result.effect_key)
    assert ledger is not None
    assert (ledger.status, ledger.receipt) == ("committed", None)


async def test_a_large_output_is_stored_and_shown_truncated_with_its_size_and_digest(
    db_url: str,
) -> None:
    """Tried: a 20 MB output under the 1 MB default, and a 3 KB one under max_output_bytes=1024."""
    seen: list[ModelRequest] = []

    @tool
    def dump(size: int) -> str:
        """A big text."""
        return "z" * size

    def script(request: ModelRequest) -> Any:
        seen.append(request)
        return calls(("c1", "dump", {"size": 20_000_000})) if request.step == 1 else FINAL

    outcome, events = await drive(Agent("a", ScriptedModel(script), [dump]), db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = results(events)
    assert result.output["truncated"] is True
    assert result.output["size"] == 20_000_002  # the JSON text, quotes included
    assert result.output["head"] == '"' + "z" * 1_999
    assert seen[1].turns[0].results[0].output == result.output  # the model sees the same
    small = Agent(
        "a",
        ScriptedModel([calls(("c1", "dump", {"size": 3_000})), FINAL]),
        [dump],
        max_output_bytes=1_024,
    )
    async with Runtime(db_url) as runtime:
        await runtime.run(small, "g", invocation_id="small")
        (result,) = results(await runtime.history("small"))
    assert result.output["truncated"] is True
    assert len(result.output["head"]) == 1_024 // 8


async def test_the_size_limits_are_recorded_with_the_run_and_checked(db_url: str) -> None:
    agent = Agent("a", ScriptedModel([FINAL]), max_output_bytes=10_000, max_proposal_bytes=2_000)
    async with Runtime(db_url) as runtime:
        await runtime.run(agent, "g", invocation_id="inv")
        invocation = await runtime.load("inv")
    assert invocation.settings is not None
    assert (invocation.settings.max_output_bytes, invocation.settings.max_proposal_bytes) == (
        10_000,
        2_000,
    )
    with pytest.raises(UsageError, match="max_output_bytes must be an integer >= 512"):
        Agent("a", ScriptedModel([FINAL]), max_output_bytes=10)


# --------------------------------------------------------------------------- BaseException


class Custom(BaseException):
    """A BaseException of the user's own."""


class BadStr(Exception):
    def __str__(self) -> str:
        raise ValueError("no str")


RAISED = [KeyboardInterrupt(), SystemExit(3), Custom("mine"), BadStr(), GeneratorExit()]
RAISED_IDS = ["KeyboardInterrupt", "SystemExit", "custom", "broken-str", "GeneratorExit"]


@pytest.mark.parametrize("error", RAISED, ids=RAISED_IDS)
async def test_a_tool_raising_any_base_exception_gets_an_error_result(
    db_url: str, error: BaseException
) -> None:
    """Tried: KeyboardInterrupt, SystemExit, a custom BaseException, a broken __str__,
    GeneratorExit, from a plain (threaded) and an async tool, on the first run and on resume."""

    @tool
    def plain() -> str:
        """Raise."""
        raise error

    @tool
    async def asynchronous() -> str:
        """Raise."""
        raise error

    model = ScriptedModel([calls(("c1", "plain", {}), ("c2", "asynchronous", {})), FINAL])
    agent = Agent("a", model, [plain, asynchronous])
    outcome, events = await drive(agent, db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    for result in results(events):
        assert result.error.error_class is ErrorClass.TOOL_FAILED
        assert type(error).__name__ in result.error.message


@pytest.mark.parametrize("error", RAISED, ids=RAISED_IDS)
async def test_a_model_raising_any_base_exception_ends_model_error(
    db_url: str, error: BaseException
) -> None:
    """Tried: the same five exceptions raised by the model's decide()."""

    def script(request: ModelRequest) -> Any:
        raise error

    outcome, _ = await drive(Agent("a", ScriptedModel(script)), db_url)
    assert outcome.reason is TerminalReason.MODEL_ERROR
    assert type(error).__name__ in (outcome.detail or "")


@pytest.mark.parametrize("error", RAISED, ids=RAISED_IDS)
async def test_a_reconcile_raising_any_base_exception_is_an_unreachable_service(
    db_url: str, error: BaseException
) -> None:
    """Tried: the five exceptions from reconcile() after a write whose outcome is unknown."""

    def reconcile(key: str) -> Reconciled:
        raise error

    @tool(effect="write", reconcile=reconcile)
    def pay() -> str:
        """Lose the reply."""
        raise ConnectionError("lost")

    outcome, _ = await drive(
        Agent("a", ScriptedModel([calls(("w", "pay", {})), FINAL]), [pay]), db_url
    )
    assert outcome.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert type(error).__name__ in (outcome.detail or "")


@pytest.mark.parametrize(
    "receipt",
    [{"id": math.nan}, {"id": "r\ud800"}, {"raw": b"\xff"}],
    ids=["nan", "surrogate", "bytes"],
)
async def test_an_unstorable_receipt_is_no_answer_the_effect_stays_open(
    db_url: str, receipt: Any
) -> None:
    """Tried: a reconciled receipt holding NaN, a lone surrogate, bytes that are not UTF-8."""

    @tool(effect="write", reconcile=lambda key: Reconciled(status="committed", receipt=receipt))
    def pay() -> str:
        """Lose the reply."""
        raise ConnectionError("lost")

    outcome, _ = await drive(
        Agent("a", ScriptedModel([calls(("w", "pay", {})), FINAL]), [pay]), db_url
    )
    assert outcome.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert "cannot be stored faithfully" in (outcome.detail or "")


async def test_a_verifier_and_a_policy_raising_base_exceptions_refuse(db_url: str) -> None:
    """Tried: an async verifier raising KeyboardInterrupt, a policy raising SystemExit,
    a verdict and a Deny reason with lone surrogates."""

    async def verifier(answer: str, turns: Any) -> Any:
        if len(turns) == 2:
            raise KeyboardInterrupt
        return "no \udc80 way" if len(turns) == 3 else True

    def policy(request: Any) -> Any:
        raise SystemExit(1)

    model = ScriptedModel([calls(("c1", "echo", {"value": 1})), FINAL, FINAL, FINAL])
    agent = Agent("a", model, [echo], verifier=verifier, policy=policy, max_verification_attempts=3)
    outcome, events = await drive(agent, db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = results(events)
    assert result.error.error_class is ErrorClass.DENIED
    assert "SystemExit" in result.error.message
    evidence = [e.evidence for e in events if type(e).__name__ == "VerificationFailed"]
    assert evidence[0] == "the verifier raised KeyboardInterrupt"
    assert evidence[1] == "no \\udc80 way"


# --------------------------------------------------------------------------- the CLI

AGENTS = textwrap.dedent(
    '''
    import math
    from pathlib import Path

    import trio

    from loop_actors import Agent, ScriptedModel, tool

    @tool
    async def wait(marker: str) -> str:
        """Say it started, then wait a long time."""
        Path(marker).write_text("started")
        await trio.sleep(60)
        return "late"

    @tool
    def interrupt() -> str:
        """Raise KeyboardInterrupt itself."""
        raise KeyboardInterrupt

    @tool
    def system_exit() -> str:
        """Raise SystemExit itself."""
        raise SystemExit(2)

    def calls(name, arguments):
        return {"kind": "tool_calls", "calls": [{"id": "c1", "name": name, "arguments": arguments}]}

    waiting = Agent("waiting", ScriptedModel([calls("wait", {"marker": "started.txt"})]), [wait])
    exiting = Agent(
        "exiting",
        ScriptedModel([calls("system_exit", {}), {"kind": "final", "answer": "ok"}]),
        [system_exit],
    )
    raising = Agent(
        "raising",
        ScriptedModel([calls("interrupt", {}), {"kind": "final", "answer": "\\x1b[31mred\\x1b[0m"}]),
        [interrupt],
    )
    '''
)


def test_a_real_ctrl_c_still_stops_a_cli_run_with_exit_130(tmp_path: Path) -> None:
    """Tried: SIGINT to a `loop-actors run` subprocess while its async tool waits."""
    (tmp_path / "edge_agents.py").write_text(AGENTS)
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    # A shell's background job ignores SIGINT, and a child inherits that: give the CLI a
    # handled SIGINT (reset to the default across exec), as a terminal's foreground job has.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [*CLI, "run", "edge_agents:waiting", "--goal", "g", "--db", db],
            cwd=tmp_path,
            env=cli_env(PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path])),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started.txt").exists():
            assert time.monotonic() < deadline, "the tool never started"
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr
    assert "interrupted" in stderr


def test_a_tool_raising_keyboard_interrupt_does_not_stop_the_cli_and_output_is_escaped(
    tmp_path: Path,
) -> None:
    """Tried: a tool raising KeyboardInterrupt, then an answer holding \\x1b[31m, printed by
    `run` and `show`."""
    (tmp_path / "edge_agents.py").write_text(AGENTS)
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    ran = run_cli(
        "run",
        "edge_agents:raising",
        "--goal",
        "g\x1b[2J",
        "--id",
        "inv",
        cwd=tmp_path,
        db=db,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr
    assert "\x1b" not in ran.stdout
    assert "\\x1b[31mred\\x1b[0m" in ran.stdout
    shown = run_cli("show", "inv", cwd=tmp_path, db=db, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout
    assert "\\x1b[2J" in shown.stdout
    assert "KeyboardInterrupt" in shown.stdout
    history = run_cli("history", "inv", cwd=tmp_path, db=db, env=env)
    assert history.returncode == 0
    assert "\x1b" not in history.stdout
    exported = run_cli("history", "inv", "--json", cwd=tmp_path, db=db, env=env)
    assert "\x1b" not in exported.stdout
    assert any(
        "red" in json.loads(line)["data"].get("answer", "") for line in exported.stdout.splitlines()
    )


def test_a_read_raising_system_exit_gives_a_typed_result_on_resume_after_a_crash(
    tmp_path: Path,
) -> None:
    """Tried: a read tool raising SystemExit, run again by `resume` after a SIGKILL between
    its dispatch and its results (the resume crashed with a traceback before)."""
    (tmp_path / "edge_agents.py").write_text(AGENTS)
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    crashed = run_cli(
        "run",
        "edge_agents:exiting",
        "--goal",
        "g",
        "--id",
        "inv",
        cwd=tmp_path,
        db=db,
        env={**env, "LOOP_ACTORS_CRASH_AT": "after_dispatch_commit"},
    )
    assert crashed.returncode == -signal.SIGKILL
    resumed = run_cli(
        "resume", "inv", "--agent", "edge_agents:exiting", cwd=tmp_path, db=db, env=env
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    shown = run_cli("show", "inv", cwd=tmp_path, db=db, env=env)
    assert "SystemExit" in shown.stdout
