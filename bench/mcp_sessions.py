"""What MCP tool calls cost: a session (a server process) per call against one per runtime.

Four sequential calls of the ``echo`` tool of tests/support/mcp_server_app.py over stdio,
made three ways, REPS times, interleaved:

- ``a session per call``: ``call_mcp_tool`` outside a runtime, which opens a session
  (starts the server process) for each call: what every call cost before sessions
  were kept (before this change, calls inside a Runtime did the same);
- ``one session, calls only``: the same four calls through one ``McpSessions``
  (what a Runtime keeps), the session opened by the first call;
- ``one session, already open``: the four calls only, on a session opened (and
  closed) outside the figure: what a call costs once its server runs;
- ``Runtime.run, 4 calls``: a whole invocation on a SQLite file making the four
  calls in four turns, in a fresh ``async with Runtime()`` (its session is opened by
  the first call and closed with the runtime, both inside the figure).

The server is a Python process importing the mcp package, like most real servers:
its start is most of the first figure.

    python bench/mcp_sessions.py [--reps 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from loop_actors import Agent, Runtime, ScriptedModel, StdioServer, TerminalReason
from loop_actors.agent.mcp import (
    call_mcp_tool,
    mcp_tools_async,
    open_mcp_sessions,
    using_mcp_sessions,
)

SERVER = StdioServer(
    command=sys.executable,
    args=[str(Path(__file__).resolve().parent.parent / "tests" / "support" / "mcp_server_app.py")],
)
CALLS = 4


async def per_call() -> None:
    for n in range(CALLS):
        assert await call_mcp_tool(SERVER, "echo", {"text": str(n)}) == str(n)


async def one_session() -> None:
    async with open_mcp_sessions() as sessions:
        with using_mcp_sessions(sessions):
            for n in range(CALLS):
                assert await call_mcp_tool(SERVER, "echo", {"text": str(n)}) == str(n)


async def already_open() -> float:
    async with open_mcp_sessions() as sessions:
        with using_mcp_sessions(sessions):
            await call_mcp_tool(SERVER, "echo", {"text": "warm"})
            started = time.perf_counter()
            for n in range(CALLS):
                assert await call_mcp_tool(SERVER, "echo", {"text": str(n)}) == str(n)
            return time.perf_counter() - started


def runtime_run(directory: Path, tools: list[Any]) -> Callable[[], Awaitable[None]]:
    runs = iter(range(10**6))

    async def run() -> None:
        script: list[dict[str, Any]] = [
            {
                "kind": "tool_calls",
                "calls": [{"id": f"e{n}", "name": "echo", "arguments": {"text": str(n)}}],
            }
            for n in range(CALLS)
        ]
        script.append({"kind": "final", "answer": "done"})
        agent = Agent("bench", ScriptedModel(script), tools)
        async with Runtime(f"sqlite:///{directory / f'run-{next(runs)}.db'}") as runtime:
            outcome = await runtime.run(agent, "four calls")
        assert outcome.reason is TerminalReason.COMPLETED

    return run


async def main(reps: int, directory: Path) -> None:
    tools = await mcp_tools_async(SERVER, include=["echo"])
    ways: dict[str, Callable[[], Awaitable[None]]] = {
        "a session per call": per_call,
        "one session, calls only": one_session,
        "Runtime.run, 4 calls": runtime_run(directory, tools),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(reps):
        for name, way in ways.items():
            started = time.perf_counter()
            await way()
            times[name].append(time.perf_counter() - started)
        times.setdefault("one session, already open", []).append(await already_open())
    print(f"{CALLS} calls of an MCP tool over stdio, median of {reps} (min-max), seconds:")
    for name, figures in times.items():
        print(
            f"  {name:<26} {statistics.median(figures):6.3f}"
            f"  ({min(figures):.3f}-{max(figures):.3f})"
        )
    ratio = statistics.median(times["a session per call"]) / statistics.median(
        times["one session, calls only"]
    )
    print(f"ratio per-call/one-session {ratio:.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=arguments.dir) as directory:
        trio.run(main, arguments.reps, Path(directory))
