"""Models: the ``Model`` protocol, ``ScriptedModel``, and what a model call gave."""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from aggregates.decisions import Usage
from aggregates.invocation import Turn
from aggregates.model_input import (
    ModelInput,
    model_input,
    notices_digest,
    recorded_form,
    text_digest,
    tool_digest,
    turn_digest_of,
)
from loop_actors._errors import ScriptExhaustedError
from loop_actors._messages import ModelReply, ModelRequest, ToolSchema

ScriptEntry = BaseModel | Mapping[str, Any]
ScriptFunction = Callable[[ModelRequest], ScriptEntry | Awaitable[ScriptEntry]]


@runtime_checkable
class Model(Protocol):
    """Anything that can propose the next decision for a request."""

    async def decide(self, request: ModelRequest) -> ModelReply:
        """Propose a decision (untrusted: the runtime validates it).

        Cancellation: must be cancellable; a cancelled call has no effect.
        """
        ...


class ScriptedModel:
    """A deterministic model for tests, demos and benchmarks.

    Either a list of decisions answered by step number (step 1 gets the first),
    so that a resumed run continues the script where the committed history left
    off; or a function that receives the :class:`ModelRequest` (goal, step and
    the committed history) and returns the next decision. Decisions may be
    decision models or their JSON shape as plain dicts, e.g.
    ``{"kind": "final", "answer": "..."}``; they are validated by the runtime
    exactly like a real model's output.
    """

    def __init__(
        self,
        script: Sequence[ScriptEntry] | ScriptFunction,
        *,
        delay_s: float = 0.0,
        usage: Usage | None = None,
    ) -> None:
        """Build a scripted model.

        Args:
            script: the decisions by step, or a function of the request.
            delay_s: simulated latency of every answer (trio time).
            usage: the usage reported with every answer.
        """
        if isinstance(script, str | bytes) or not (
            callable(script) or isinstance(script, Sequence)
        ):
            raise TypeError("script must be a list of decisions or a function of the request")
        if not (delay_s >= 0 and math.isfinite(delay_s)):
            raise ValueError("delay_s must be a finite number >= 0")
        self.script = script
        self.delay_s = delay_s
        self.usage = usage or Usage()

    async def decide(self, request: ModelRequest) -> ModelReply:
        """Answer the step's scripted decision.

        Raises:
            ScriptExhaustedError: the list has no decision for this step.

        Cancellation: a checkpoint (also while simulating latency).
        """
        if self.delay_s:
            # Imported here: importing an agent imports no trio (the timers' module does).
            from loop_actors._timers import sleep  # noqa: PLC0415

            await sleep(self.delay_s)
        if callable(self.script):
            proposal = self.script(request)
            if type(proposal) is not dict and inspect.isawaitable(proposal):
                proposal = await proposal
        else:
            if request.step > len(self.script):
                raise ScriptExhaustedError(
                    f"the script has {len(self.script)} decision(s), step {request.step} was asked"
                )
            proposal = self.script[request.step - 1]
        if type(proposal) is dict or isinstance(proposal, Mapping):
            proposal = dict(proposal)
        return ModelReply(proposal=proposal, usage=self.usage)


def model_identity(model: object) -> str:
    """What names a model in a request's digest: its class, and its model name if it has one.

    A model that stands in for another (replay's) says whose identity it keeps with a
    ``model_identity`` attribute.
    """
    kept = getattr(model, "model_identity", None)
    if isinstance(kept, str):
        return kept
    cls = type(model)
    name = getattr(model, "model", None)
    identity = f"{cls.__module__}.{cls.__qualname__}"
    return f"{identity}:{name}" if isinstance(name, str) else identity


def turn_digest(turn: Turn) -> str:
    """The digest of a turn as the model is shown it (no durations, no effect keys)."""
    return turn_digest_of(turn.model_dump_json(exclude_none=True, exclude=_NOT_SHOWN))


_NOT_SHOWN: Any = {"results": {"__all__": {"duration_ms", "effect_key"}}}
"""What a turn's digest leaves out: what no model is shown, and what differs by run."""


def tool_digests(schemas: Sequence[ToolSchema]) -> dict[str, str]:
    """Each tool's digest by name (taken once for a list of schemas: a toolbox's)."""
    key = id(schemas)
    cached = _TOOL_DIGESTS.get(key)
    if cached is None or cached[0] is not schemas:
        digests = {s.name: tool_digest(s.name, s.description, s.parameters) for s in schemas}
        cached = _TOOL_DIGESTS[key] = (schemas, digests)
        if len(_TOOL_DIGESTS) > _TOOL_DIGESTS_KEPT:
            del _TOOL_DIGESTS[next(iter(_TOOL_DIGESTS))]
    return cached[1]


_TOOL_DIGESTS: dict[int, tuple[Sequence[ToolSchema], dict[str, str]]] = {}
"""The tool digests of the last toolboxes seen (the schemas list is kept: its id stays its)."""
_TOOL_DIGESTS_KEPT = 64


class RequestDigests:
    """The digests of one agent's model requests, each turn's taken once.

    Tools are digested when made (a toolbox does not change); a turn when first seen,
    kept by its step while the same turn object is shown again.
    """

    def __init__(self, model: object, schemas: Sequence[ToolSchema]) -> None:
        self.identity = model_identity(model)
        self.tools = tool_digests(schemas)
        self._turns: dict[int, tuple[Turn, str]] = {}
        self._last: ModelInput | None = None
        self._goal: tuple[str, str] | None = None
        self._notices: tuple[tuple[str, ...], str] | None = None
        self._model = text_digest(self.identity)

    def of(
        self,
        *,
        goal: str,
        notices: Sequence[str],
        turns: Sequence[Turn],
        offered: Collection[str] | None = None,
    ) -> ModelInput:
        """What a decision records of a request for this goal, these notices and this view.

        Its parts that differ from the request before (all of them for the first).
        ``offered``: the names of the tools the request offers, when not all of them
        (a plan's read-only ceiling).
        """
        digests = []
        for turn in turns:
            cached = self._turns.get(turn.step)
            if cached is None or cached[0] is not turn:
                cached = self._turns[turn.step] = (turn, turn_digest(turn))
            digests.append(cached[1])
        if self._goal is None or self._goal[0] != goal:
            self._goal = (goal, text_digest(goal))
        shown = tuple(notices)
        if self._notices is None or self._notices[0] != shown:
            self._notices = (shown, notices_digest(shown))
        current = model_input(
            model=self._model,
            instructions=self._goal[1],
            notices=self._notices[1],
            tools=self.tools
            if offered is None
            else {name: d for name, d in self.tools.items() if name in offered},
            turn_digests=digests,
        )
        recorded, self._last = recorded_form(self._last, current), current
        return recorded
