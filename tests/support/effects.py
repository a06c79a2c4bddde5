"""A write whose outcome nobody knows, paused ``reconciliation_required``: for settling it by hand.

``paused_project`` makes it with the CLI (the agent is ``AGENTS``, written as ``agents.py``);
``api_agent`` and ``paused_run`` with the public API. Either way the effect is ``KEY``, of
invocation ``INVOCATION``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from aggregates.effect import effect_key
from loop_actors import (
    Agent,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolContext,
    tool,
)
from tests.support.cli import run_cli

AGENTS = '''
import json

import trio

from loop_actors import Agent, ScriptedModel, tool


@tool(effect="write", timeout_s=0.2, sensitive_output=["token"])
async def write_file(path: str) -> dict:
    """Write a file on an MCP-like server: not idempotent, no reconcile."""
    await trio.sleep(30)  # the server never answers within the timeout
    return {"path": path}


def decide(request):
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "/a"}}],
        }
    (result,) = request.results
    if result.error is None:
        output = result.output
        if isinstance(output, dict) and output.get("token") == "s3cret":
            output = {**output, "token": "real"}  # say it saw it, without repeating it
        seen = {"output": output}
    else:
        seen = {"error": result.error.error_class, "message": result.error.message}
    return {"kind": "final", "answer": json.dumps(seen, sort_keys=True)}


writer = Agent("writer", ScriptedModel(decide), [write_file])
other = Agent("other", ScriptedModel([{"kind": "final", "answer": "x"}]), [write_file])
'''


INVOCATION = "inv-1"


KEY = effect_key(INVOCATION, 1, "w1")


def cli(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=project, db=f"sqlite:///{project / 'store.db'}")


def paused_project(project: Path) -> Path:
    """A store in which ``inv-1`` is paused ``reconciliation_required`` on ``KEY``."""
    project.mkdir(exist_ok=True)
    (project / "agents.py").write_text(AGENTS)
    ran = cli(project, "run", "agents:writer", "--goal", "write /a", "--id", INVOCATION)
    assert ran.returncode == 3, ran.stderr
    assert ran.stdout.splitlines()[0] == "reconciliation_required"
    assert "no reconcile function" in ran.stdout
    return project


def ledger(project: Path) -> list[dict[str, Any]]:
    history = cli(project, "history", KEY, "--json")
    assert history.returncode == 0, history.stderr
    return [json.loads(line) for line in history.stdout.splitlines()]


def api_agent(seen: list[Any]) -> Agent:
    @tool(effect="write", sensitive_output=["token"])
    async def write_file(path: str) -> dict[str, Any]:
        """Write without reconcile; the connection drops mid-call."""
        raise ConnectionResetError("connection reset by peer")

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "/a"}}],
            }
        seen.extend(request.results)
        return {"kind": "final", "answer": "done"}

    return Agent("writer", ScriptedModel(decide), [write_file])


async def paused_run(runtime: Runtime, agent: Agent) -> None:
    outcome = await runtime.run(agent, "write /a", invocation_id=INVOCATION)
    assert outcome.reason is TerminalReason.RECONCILIATION_REQUIRED


class Relay:
    """A service that records messages by key; while ``losing``, requests never reach it."""

    def __init__(self) -> None:
        self.losing = True
        self.sent: dict[str, str] = {}
        self.requests = 0

    def agent(self, name: str = "relay") -> Agent:
        def reconcile(key: str) -> Reconciled:
            if key in self.sent:
                return Reconciled(status="committed", receipt={"sent": self.sent[key]})
            return Reconciled(status="not_found")

        @tool(effect="write", reconcile=reconcile)
        def send(message: str, context: ToolContext) -> dict[str, Any]:
            """Send a message through the relay."""
            if self.losing:
                raise TimeoutError("the request was lost on its way to the relay")
            assert context.effect_key is not None
            self.requests += 1
            self.sent.setdefault(context.effect_key, message)
            return {"sent": self.sent[context.effect_key]}

        def decide(request: ModelRequest) -> dict[str, Any]:
            if request.step == 1:
                call = {"id": "s1", "name": "send", "arguments": {"message": "hello"}}
                return {"kind": "tool_calls", "calls": [call]}
            return {"kind": "final", "answer": "sent"}

        return Agent(name, ScriptedModel(decide), [send])
