"""Inline calls run in the batch's own task: no task, thread or cancel scope of their own.

An inline tool (``@tool(inline=True)``, a plain function) cannot be interrupted once it
runs, so the tool runner calls it in the batch's task; the group's other calls start
once the inline ones are done. These tests hold the runner to what that must not
change: one result per call in call order, a failing call answered with its error,
a cancel request answered for the calls still running, and a tool that is no longer
in the catalogue (a resume with a changed agent) answered ``unavailable``.

Bad inputs tried: an inline tool that raises, one that raises trio's ``Cancelled`` of
its own making, one that takes longer than its timeout, one that blocks past the
invocation's deadline before an async call of its group, a cancel request while an async
call of the same group blocks, the caller's scope cancelled during a run whose every
call is inline (nothing else in it checkpoints), and a dispatched call whose tool the
resuming agent no longer has (after a real SIGKILL).
"""

from __future__ import annotations

import contextvars
import signal
import time
from pathlib import Path
from typing import Any

import trio

from aggregates.invocation import ResultsCommitted, Terminated
from loop_actors import (
    Agent,
    Budget,
    ErrorClass,
    ModelRequest,
    Outcome,
    Runtime,
    ScriptedModel,
    TerminalReason,
    Tool,
    tool,
)
from tests.support.cli import run_cli
from tests.support.replies import calls


async def run_once(db_url: str, agent: Agent) -> tuple[Outcome, list[ResultsCommitted]]:
    """Run ``agent`` once on a new runtime: its outcome and the batches' results it committed."""
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            outcome = await runtime.run(agent, "g", invocation_id="inv")
            events = await runtime.history("inv")
    return outcome, [e for e in events if isinstance(e, ResultsCommitted)]


class CallTasks(trio.abc.Instrument):
    """Counts the tasks the tool runner spawns for calls."""

    def __init__(self) -> None:
        self.spawned = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("BatchRun._run_one"):
            self.spawned += 1


@tool(inline=True)
def inline_lookup(key: str) -> dict[str, str]:
    """Answer at once (inline)."""
    return {"key": key}


@tool
async def async_lookup(key: str) -> dict[str, str]:
    """Answer at once (async)."""
    return {"key": key}


def three_turns_of(name: str) -> ScriptedModel:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step <= 3:
            s = request.step
            return calls(*((f"c{s}{j}", name, {"key": f"k{s}{j}"}) for j in range(3)))
        return {"kind": "final", "answer": ",".join(str(r.output) for r in request.results)}

    return ScriptedModel(decide)


async def test_inline_calls_run_without_a_task_of_their_own(db_url: str) -> None:
    counted = {}
    for tool_ in (inline_lookup, async_lookup):
        tasks = CallTasks()
        trio.lowlevel.add_instrument(tasks)
        try:
            with trio.fail_after(30):
                async with Runtime(db_url) as runtime:
                    agent = Agent("lookups", three_turns_of(tool_.name), [tool_])
                    outcome = await runtime.run(agent, "look up nine keys")
        finally:
            trio.lowlevel.remove_instrument(tasks)
        assert outcome.reason is TerminalReason.COMPLETED
        assert outcome.answer is not None
        assert outcome.answer.count("'key'") == 9
        counted[tool_.name] = tasks.spawned
    assert counted == {"inline_lookup": 0, "async_lookup": 9}


async def test_a_group_of_inline_and_async_calls_answers_each_call_in_call_order(
    db_url: str,
) -> None:
    ran: list[str] = []

    @tool(inline=True)
    def now(key: str) -> str:
        """Answer at once, inline."""
        ran.append(key)
        return f"now {key}"

    @tool
    async def later(key: str) -> str:
        """Answer after a checkpoint."""
        ran.append(key)
        await trio.sleep(0.01)
        return f"later {key}"

    model = ScriptedModel(
        [
            calls(
                ("a1", "later", {"key": "a1"}),
                ("i1", "now", {"key": "i1"}),
                ("a2", "later", {"key": "a2"}),
                ("i2", "now", {"key": "i2"}),
            ),
            {"kind": "final", "answer": "done"},
        ]
    )
    outcome, batches = await run_once(db_url, Agent("mixed", model, [now, later]))
    assert outcome.reason is TerminalReason.COMPLETED
    (committed,) = batches
    assert [(r.call_id, r.output) for r in committed.results] == [
        ("a1", "later a1"),
        ("i1", "now i1"),
        ("a2", "later a2"),
        ("i2", "now i2"),
    ]
    assert ran[:2] == ["i1", "i2"]  # the inline calls first, in order; then the tasks
    assert sorted(ran[2:]) == ["a1", "a2"]


async def test_an_inline_call_that_raises_is_answered_tool_failed_and_the_others_run(
    db_url: str,
) -> None:
    @tool(inline=True)
    def broken(key: str) -> str:
        """Fail."""
        raise RuntimeError(f"no {key}")

    model = ScriptedModel(
        [
            calls(
                ("b", "broken", {"key": "b"}),
                ("ok", "inline_lookup", {"key": "ok"}),
            ),
            {"kind": "final", "answer": "done"},
        ]
    )
    outcome, batches = await run_once(db_url, Agent("breaks", model, [broken, inline_lookup]))
    assert outcome.reason is TerminalReason.COMPLETED
    (committed,) = batches
    by_id = {r.call_id: r for r in committed.results}
    assert by_id["b"].error is not None
    assert by_id["b"].error.error_class is ErrorClass.TOOL_FAILED
    assert "no b" in by_id["b"].error.message
    assert by_id["ok"].output == {"key": "ok"}


async def test_an_inline_call_longer_than_its_timeout_keeps_its_result(db_url: str) -> None:
    @tool(inline=True, timeout_s=0.001)
    def slow(key: str) -> str:
        """Block the event loop for a moment (what inline tools must not do)."""
        time.sleep(0.02)
        return key

    model = ScriptedModel([calls(("s", "slow", {"key": "s"})), {"kind": "final", "answer": "done"}])
    outcome, batches = await run_once(db_url, Agent("slow", model, [slow]))
    assert outcome.reason is TerminalReason.COMPLETED
    (committed,) = batches
    (result,) = committed.results
    assert result.output == "s"  # nothing can interrupt it: its result is kept
    assert result.duration_ms is not None
    assert result.duration_ms >= 20


async def test_a_cancel_while_an_async_call_blocks_keeps_the_inline_results(db_url: str) -> None:
    started = trio.Event()

    @tool
    async def blocks(key: str) -> str:
        """Wait until cancelled."""
        started.set()
        await trio.sleep_forever()
        return key  # pragma: no cover - never reached

    model = ScriptedModel(
        [
            calls(
                ("i1", "inline_lookup", {"key": "i1"}),
                ("w", "blocks", {"key": "w"}),
                ("i2", "inline_lookup", {"key": "i2"}),
            )
        ]
    )
    agent = Agent("cancelled", model, [inline_lookup, blocks])
    outcomes: list[Any] = []
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            async with trio.open_nursery() as nursery:

                async def go() -> None:
                    outcomes.append(await runtime.run(agent, "g", invocation_id="c"))

                nursery.start_soon(go)
                await started.wait()
                assert runtime.cancel("c") is True
            events = await runtime.history("c")
    (outcome,) = outcomes
    assert outcome.reason is TerminalReason.CANCELLED
    (committed,) = [e for e in events if isinstance(e, ResultsCommitted)]
    by_id = {r.call_id: r for r in committed.results}
    assert by_id["i1"].output == {"key": "i1"}
    assert by_id["i2"].output == {"key": "i2"}
    assert by_id["w"].error is not None
    assert by_id["w"].error.error_class is ErrorClass.CANCELLED
    assert isinstance(events[-1], Terminated)


APP = '''
from loop_actors import Agent, ScriptedModel, tool


@tool(inline=True)
def lookup(key: str) -> str:
    """Answer at once."""
    return key


def decide(request):
    if request.step == 1:
        return {"kind": "tool_calls",
                "calls": [{"id": "l1", "name": "lookup", "arguments": {"key": "a"}}]}
    return {"kind": "final", "answer": repr(request.results[0].error.error_class.value)}


agent = Agent("inline-app", ScriptedModel(decide), [lookup])
'''


async def test_a_dispatched_call_whose_tool_is_gone_on_resume_is_answered_unavailable(
    tmp_path: Path,
) -> None:
    (tmp_path / "inline_app.py").write_text(APP)
    db = f"sqlite:///{tmp_path / 'run.db'}"
    crashed = run_cli(
        "run", "inline_app:agent", "--goal", "g", "--id", "gone",
        cwd=tmp_path, db=db, env={"LOOP_ACTORS_CRASH_AT": "after_dispatch_commit"},
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    def decide(request: ModelRequest) -> dict[str, Any]:
        (result,) = request.results
        assert result.error is not None
        return {"kind": "final", "answer": result.error.error_class.value}

    without_the_tool = Agent("inline-app", ScriptedModel(decide), [Tool(async_lookup.fn)])
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.resume("gone", without_the_tool, allow_catalogue_change=True)
            events = await runtime.history("gone")
    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.answer == ErrorClass.UNAVAILABLE.value
    (committed,) = [e for e in events if isinstance(e, ResultsCommitted)]
    (result,) = committed.results
    assert result.call_id == "l1"
    assert result.error is not None
    assert "no longer in the agent's catalogue" in result.error.message


MARK: contextvars.ContextVar[str] = contextvars.ContextVar("MARK", default="unset")


async def test_what_an_inline_call_sets_in_a_context_variable_stays_in_that_call(
    db_url: str,
) -> None:
    @tool(inline=True)
    def mark(key: str) -> str:
        """Set a context variable (as tracing libraries do) and leave it set."""
        MARK.set(key)
        return MARK.get()

    @tool(inline=True)
    def read_mark(key: str) -> str:
        """What the context variable holds."""
        return MARK.get()

    model = ScriptedModel(
        [
            calls(("m", "mark", {"key": "changed"}), ("r", "read_mark", {"key": "r"})),
            calls(("r2", "read_mark", {"key": "r2"})),
            {"kind": "final", "answer": "done"},
        ]
    )
    outcome, batches = await run_once(db_url, Agent("marks", model, [mark, read_mark]))
    assert outcome.reason is TerminalReason.COMPLETED
    outputs = [r.output for e in batches for r in e.results]
    assert outputs == ["changed", "unset", "unset"]  # as if each call had a task of its own
    assert MARK.get() == "unset"


async def test_a_cancelled_callers_scope_stops_a_run_whose_calls_are_all_inline(
    db_url: str,
) -> None:
    ran: list[int] = []
    scope = trio.CancelScope()

    @tool(inline=True)
    def count(n: int) -> int:
        """Count; the fifth call cancels the caller's scope (as a timeout would)."""
        ran.append(n)
        if n == 5:
            scope.cancel()
        return n

    def decide(request: ModelRequest) -> dict[str, Any]:  # never awaits: no checkpoint
        return calls((f"c{request.step}", "count", {"n": request.step}))

    agent = Agent("counter", ScriptedModel(decide), [count], Budget(max_steps=50))
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            with scope:
                await runtime.run(agent, "count", invocation_id="n")
            invocation = await runtime.load("n")
    assert scope.cancelled_caught
    assert ran == [1, 2, 3, 4, 5]  # the next batch's checkpoint is where it landed
    assert invocation.terminated is not None
    assert invocation.terminated.reason is TerminalReason.CANCELLED


async def test_no_async_call_starts_once_the_inline_calls_before_it_passed_the_deadline(
    db_url: str,
) -> None:
    started: list[str] = []

    @tool(inline=True)
    def slow(key: str) -> str:
        """Block past the invocation's deadline."""
        time.sleep(0.2)
        return key

    @tool
    async def later(key: str) -> str:
        """Must not start after the deadline."""
        started.append(key)
        return key

    model = ScriptedModel([calls(("s", "slow", {"key": "s"}), ("l", "later", {"key": "l"}))])
    agent = Agent("late", model, [slow, later], Budget(deadline_s=0.1))
    outcome, batches = await run_once(db_url, agent)
    assert outcome.reason is TerminalReason.DEADLINE_EXCEEDED
    assert started == []
    (committed,) = batches
    by_id = {r.call_id: r for r in committed.results}
    assert by_id["s"].output == "s"  # it ran: its result is kept
    assert by_id["l"].error is not None
    assert by_id["l"].error.error_class is ErrorClass.DEADLINE_EXCEEDED
    assert "never started" in by_id["l"].error.message


async def test_an_inline_tool_that_raises_trios_cancelled_itself_is_answered_tool_failed(
    db_url: str,
) -> None:
    @tool(inline=True)
    def impostor(key: str) -> str:
        """Raise a Cancelled of its own making (no cancellation of trio's can reach it)."""
        raise trio.Cancelled._create()  # what a buggy tool could do

    model = ScriptedModel(
        [calls(("x", "impostor", {"key": "x"})), {"kind": "final", "answer": "done"}]
    )
    outcome, batches = await run_once(db_url, Agent("impostor", model, [impostor]))
    assert outcome.reason is TerminalReason.COMPLETED
    (committed,) = batches
    (result,) = committed.results
    assert result.error is not None
    assert result.error.error_class is ErrorClass.TOOL_FAILED
