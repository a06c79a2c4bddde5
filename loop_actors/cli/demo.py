"""Seed 000's example: look up a profile and a policy in parallel, then answer.

And the ``demo`` command, which runs it and shows its trajectory.
"""

from __future__ import annotations

import argparse

import trio

from loop_actors._messages import ModelRequest
from loop_actors._render import console, render_tree
from loop_actors.agent.agent import Agent
from loop_actors.agent.model import ScriptedModel
from loop_actors.agent.tools import tool
from loop_actors.cli.common import outcome_lines, runtime_for, trio_run
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.runtime.runtime import Runtime
from loop_actors.store.url import redacted_url
from projections import build_trajectory

VALUES = {"profile": "active", "policy": "refund-under-100"}


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look up a key (the profile answers last, to show that call order is kept)."""
    if key == "profile":
        await trio.sleep(0.01)
    if key not in VALUES:
        raise KeyError(f"key {key!r} not found")
    return {"key": key, "value": VALUES[key]}


def _decide(request: ModelRequest) -> dict[str, object]:
    if not request.turns:
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "call-profile", "name": "lookup", "arguments": {"key": "profile"}},
                {"id": "call-policy", "name": "lookup", "arguments": {"key": "policy"}},
            ],
        }
    values = {
        r.output["key"]: r.output["value"] for r in request.results if isinstance(r.output, dict)
    }
    return {"kind": "final", "answer": f"profile={values['profile']}; policy={values['policy']}"}


demo_agent = Agent(name="demo", model=ScriptedModel(_decide), tools=[lookup])
"""The demo agent: ``loop-actors run loop_actors.cli.demo:demo_agent --goal ...`` runs it too."""

DEMO_GOAL = "Can this customer get a refund? Look up their profile and the refund policy."


async def _demo(runtime: Runtime) -> ExitCode:
    async with runtime:
        outcome = await runtime.run(demo_agent, DEMO_GOAL)
        events = await runtime.history(outcome.invocation_id)
    print("\n".join(outcome_lines(outcome, len(events))))
    print()
    # The same fold and the same tree as `loop-actors show` of this invocation.
    out = console()
    out.print(render_tree(build_trajectory(events), width=out.width))
    print()
    print(
        f"history: loop-actors history {outcome.invocation_id} --db {redacted_url(runtime.db_url)}"
    )
    return ExitCode(outcome.exit_code)


def run(args: argparse.Namespace) -> int:
    """``demo``: run the demo agent, print its outcome and trajectory."""
    return trio_run(_demo, runtime_for(args))
