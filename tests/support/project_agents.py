"""Agent modules a test writes into a project folder as ``agents.py``, for the CLI to load.

``AGENTS`` holds ``answering`` (a lookup, then an answer) and ``asking`` (a question): the
commands are given ``--agent agents:answering`` or ``agents:asking``.
"""

from __future__ import annotations

AGENTS = '''
from loop_actors import Agent, ScriptedModel, tool

@tool
def lookup(key: str) -> dict:
    """Look up a key."""
    return {"key": key}

answering = Agent(
    "answering",
    ScriptedModel([
        {"kind": "tool_calls", "calls": [{"id": "c1", "name": "lookup", "arguments": {"key": "k"}}]},
        {"kind": "final", "answer": "done"},
    ]),
    [lookup],
)
asking = Agent("asking", ScriptedModel([{"kind": "clarification", "question": "Which one?"}]))
'''
