"""What a ``ScriptedModel`` answers in the tests: a tool batch, a final answer, one call.

Each is the plain JSON shape a model's reply has (docs/reference/api.md, ``ScriptedModel``),
so a script reads as the decisions it makes: ``[calls(("c1", "lookup", {"key": "a"})),
FINAL]``.
"""

from __future__ import annotations

from typing import Any

FINAL = {"kind": "final", "answer": "done"}
"""A final answer, ``done``."""


def calls(*items: tuple[str, str, Any]) -> dict[str, Any]:
    """A tool batch of ``(id, name, arguments)`` calls, in order (arguments as given)."""
    return {
        "kind": "tool_calls",
        "calls": [{"id": i, "name": n, "arguments": a} for i, n, a in items],
    }


def final(answer: str) -> dict[str, Any]:
    """A final answer."""
    return {"kind": "final", "answer": answer}


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    """One call of a tool batch, its arguments given as keywords."""
    return {"id": call_id, "name": name, "arguments": arguments}
