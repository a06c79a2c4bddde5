"""How a provider's model proposes a plan: the ``propose_plan`` tool, and a plan's turn.

While a run plans (``ModelRequest.planning``: the read-only ceiling of an agent given
``planning``), the model adapters offer one more tool, ``propose_plan``; a call of it,
alone in its turn, is read as the ``plan`` decision it means (the turn core checks it
like any proposal). A plan's turn is shown to the model as its plan and the decision on
it (who approved or denied it).
"""

from __future__ import annotations

import json
from typing import Any

from aggregates.decisions import Plan
from aggregates.invocation import Turn
from loop_actors._messages import ModelRequest, ToolSchema
from loop_actors.agent.replies import lone_call

PLAN_TOOL = "propose_plan"
"""The tool a provider's model proposes its plan with."""

PLAN_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "description": "what the plan does, in a sentence"},
        "steps": {
            "type": "array",
            "description": "each write the plan will make, in order",
            "items": {
                "type": "object",
                "properties": {
                    "tool": {"type": "string", "description": "a write tool of this agent"},
                    "arguments": {"type": "object", "description": "its arguments"},
                    "description": {"type": "string", "description": "what it is for"},
                },
                "required": ["tool", "arguments"],
            },
        },
    },
    "required": ["steps"],
}

PLAN_INSTRUCTION = (
    f"To propose your plan, call {PLAN_TOOL} (alone in its turn) with each write you will "
    "make: its tool and its exact arguments."
)
"""What the adapters' instructions add while the run plans."""


def plan_schemas(request: ModelRequest) -> list[ToolSchema]:
    """The plan tool of a request that plans (none otherwise)."""
    if not request.planning:
        return []
    return [
        ToolSchema(
            name=PLAN_TOOL,
            description="Propose the writes you will make, for a person to approve.",
            parameters=PLAN_PARAMETERS,
        )
    ]


def as_plan(proposal: Any, request: ModelRequest) -> Any:
    """A proposal of one call of the plan tool, as the ``plan`` decision it means.

    Any other proposal as it is (a plan call among others, or with arguments that are
    not an object, is an unknown tool: the core rejects it, and the model is told).
    """
    called = lone_call(proposal) if request.planning else None
    if called is None or called[0] != PLAN_TOOL:
        return proposal
    arguments = called[1]
    return {
        "kind": "plan",
        "steps": arguments.get("steps", []),
        "summary": arguments.get("summary", ""),
    }


def plan_exchange(turn: Turn) -> list[dict[str, Any]]:
    """A plan's turn as plain text messages: the plan, then who decided on it."""
    plan = turn.decision
    assert isinstance(plan, Plan)
    steps = [s.model_dump(mode="json", exclude_defaults=True) for s in plan.steps]
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": f"My plan: {plan.summary or 'these writes'}: {json.dumps(steps)}",
        }
    ]
    if turn.approval:
        messages.append({"role": "user", "content": f"The plan was {turn.approval}."})
    return messages
