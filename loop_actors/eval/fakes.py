"""Tool fakes of an eval case: a tool's answer given in the cases file, the tool not run.

``"fakes": {"lookup": {"output": "v"}, "pay": {"error": "card declined"}}`` runs the
case with the agent's ``lookup`` and ``pay`` replaced by fakes that keep each tool's
name, effect, argument schema and approval rule (so the run records the same
catalogue, validates the same arguments and pauses for the same approvals) but
return the given output, or fail with the given error, instead of calling anything.
The agent's other tools are its real ones.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pydantic import JsonValue, model_validator

from aggregates.decisions import ErrorClass, Frozen
from loop_actors._errors import ToolError, UsageError
from loop_actors.agent.agent import Agent
from loop_actors.agent.tools import Tool


class ToolFake(Frozen):
    """What a faked tool answers to every call: an output, or an error."""

    output: JsonValue = None
    """Returned as the call's result (for a write: its effect committed)."""
    error: str | None = None
    """Raised as a ``ToolError`` with this message (for a write: rejected, unless
    ``error_class`` is ``outcome_unknown``, ``unavailable`` or ``timeout``)."""
    error_class: ErrorClass = ErrorClass.TOOL_FAILED
    retryable: bool = False

    @model_validator(mode="after")
    def _one_answer(self) -> ToolFake:
        given = self.model_fields_set
        if ("output" in given) == ("error" in given):
            raise ValueError("give exactly one of output and error")
        if "error" not in given and ({"error_class", "retryable"} & given):
            raise ValueError("error_class and retryable go with error")
        return self


def _fake_of(real: Tool, fake: ToolFake) -> Tool:
    """``real`` answering with ``fake``: the same spec, another function, no reconcile."""

    def answer(**_arguments: Any) -> JsonValue:
        if fake.error is not None:
            raise ToolError(fake.error, error_class=fake.error_class, retryable=fake.retryable)
        return fake.output

    faked = copy.copy(real)
    faked.fn = answer
    faked.is_async = False
    faked.inline = True  # nothing to wait for: no worker thread
    faked.context_parameter = None
    faked.reconcile = None  # the fake's answer is certain; there is no service to ask
    return faked


def unknown_fakes(agent: Agent, fakes: Mapping[str, ToolFake]) -> list[str]:
    """The faked tool names the agent has no tool of, sorted."""
    return sorted(name for name in fakes if name not in agent.toolbox.tools)


def with_fakes(agent: Agent, fakes: Mapping[str, ToolFake]) -> Agent:
    """``agent`` with the named tools faked (see the module's docstring).

    Raises:
        UsageError: the agent has no tool of a faked name.
    """
    missing = unknown_fakes(agent, fakes)
    if missing:
        raise UsageError(f"agent {agent.name} has no tool {missing[0]!r} to fake")
    tools = agent.toolbox.tools
    return agent.with_tools(*(_fake_of(tools[name], fake) for name, fake in fakes.items()))
