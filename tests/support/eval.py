"""For the eval tests: an agent module, answer checks, a hostile suite, a write tool, the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loop_actors import tool

AGENT = '''
from loop_actors import Agent, ScriptedModel, tool

@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return {"k": "v", "evil": "</pre><script>window.pwned = 3</script>"}.get(key, "")

@tool(effect="write")
def send(to: str) -> str:
    """Send a message (a write)."""
    return f"sent to {to}"

@tool(effect="write")
def flaky_send(to: str) -> str:
    """A write that fails mid-call: its outcome is unknown."""
    raise RuntimeError(f"connection reset while sending to {to}")

agent = Agent(
    "suite",
    ScriptedModel([{"kind": "final", "answer": "unscripted"}]),
    [lookup, send, flaky_send],
)
'''


CHECKS = """
def short(answer):
    return True if len(answer) <= 3 else f"{len(answer)} characters, at most 3"

NOT_CALLABLE = 3
"""


HOSTILE_GOAL = "<script>window.pwned = 1</script> say hi"


HOSTILE_ANSWER = '<img src=x onerror="window.pwned = 2"> hello'


def hostile_suite() -> dict[str, Any]:
    """Goals, answers and tool outputs that are HTML: the page must show them, not run them."""
    return {
        "name": "hostile",
        "agent": "suite_agent:agent",
        "cases": [
            {
                "id": "answers",
                "goal": HOSTILE_GOAL,
                "task_class": "chat<b>",
                "model": [{"kind": "final", "answer": HOSTILE_ANSWER}],
                "expect": {"reason": "completed", "answer": {"equals": "hi"}},
            },
            {
                "id": "parallel",
                "goal": "look up two keys at once",
                "task_class": "lookup",
                "model": [
                    {
                        "kind": "tool_calls",
                        "calls": [
                            {"id": "c1", "name": "lookup", "arguments": {"key": "evil"}},
                            {"id": "c2", "name": "lookup", "arguments": {"key": "k"}},
                        ],
                    },
                    {
                        "kind": "tool_calls",
                        "calls": [{"id": "w1", "name": "send", "arguments": {"to": "ops"}}],
                    },
                    {"kind": "final", "answer": "v"},
                ],
                "expect": {"reason": "completed", "effects": {"committed": ["send"]}},
            },
        ],
    }


def eval_db(project: Path) -> str:
    return f"sqlite:///{project / 'eval.db'}"


def read_report(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@tool(effect="write")
def send(to: str) -> str:
    """Send a message (a write)."""
    return f"sent to {to}"
