"""A model's reply, or its failure, as the turn core's observation (ModelAnswered, ModelFailed).

Apart from :mod:`loop_actors.agent.model` (the ``Model`` protocol, ``ScriptedModel``),
which an agent's module imports: these are the runtime's, and they import the turn
core's messages.
"""

from __future__ import annotations

import json
from typing import Any

from aggregates.model_input import ModelInput
from aggregates.turn_messages import ModelAnswered, ModelFailed
from aggregates.values import safe_text
from loop_actors._messages import ModelReply


def model_failure(error: BaseException) -> ModelFailed:
    """A model call that raised (anything but trio's cancellation): data for the core.

    KeyboardInterrupt, SystemExit and the like from the model's code included; the
    caller lets trio's cancellation pass (a deadline, a cancelled run).
    """
    return ModelFailed(
        error_type=safe_text(type(error).__name__, limit=200), message=safe_text(error)
    )


def model_answer(
    reply: object, model_input: ModelInput | None = None
) -> ModelAnswered | ModelFailed:
    """What ``Model.decide`` returned, as the core's observation (with its request's digests)."""
    if not isinstance(reply, ModelReply):
        return ModelFailed(
            error_type="TypeError",
            message=f"decide() must return a ModelReply, got {safe_text(type(reply).__name__)}",
        )
    # Read as data, never trusted for its class: a reply built with model_construct may
    # lack its proposal (a missing one is None: rejected) or hold any usage (the core
    # admits it, aggregates.revalidation.admitted_usage).
    fields = vars(reply)
    return ModelAnswered(
        proposal=fields.get("proposal"), usage=fields.get("usage"), model_input=model_input
    )


def lone_call(proposal: object) -> tuple[str, dict[str, Any]] | None:
    """A proposal of exactly one tool call: the tool's name and its arguments as an object.

    None for anything else (another decision, several calls, arguments that are not a
    JSON object): the turn core judges those as they are. What the adapters read as the
    decision a tool of their own stands for (a handoff, a plan).
    """
    if not isinstance(proposal, dict):
        return None
    calls = proposal.get("calls")
    if proposal.get("kind") != "tool_calls" or not isinstance(calls, list) or len(calls) != 1:
        return None
    call = calls[0]
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            return None  # malformed: the core says so
    if not isinstance(arguments, dict):
        return None
    return call["name"], arguments
