"""Models: the ``Model`` protocol, ``ScriptedModel``, and what a model call gave."""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from aggregates.decisions import Usage
from aggregates.turn import ModelAnswered, ModelFailed
from aggregates.values import safe_text
from loop_actors._errors import ScriptExhaustedError
from loop_actors._messages import ModelReply, ModelRequest
from loop_actors._timers import sleep

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


def model_failure(error: BaseException) -> ModelFailed:
    """A model call that raised (anything but trio's cancellation): data for the core.

    KeyboardInterrupt, SystemExit and the like from the model's code included; the
    caller lets trio's cancellation pass (a deadline, a cancelled run).
    """
    return ModelFailed(
        error_type=safe_text(type(error).__name__, limit=200), message=safe_text(error)
    )


def model_answer(reply: object) -> ModelAnswered | ModelFailed:
    """What ``Model.decide`` returned, as the core's observation."""
    if not isinstance(reply, ModelReply):
        return ModelFailed(
            error_type="TypeError",
            message=f"decide() must return a ModelReply, got {safe_text(type(reply).__name__)}",
        )
    return ModelAnswered(proposal=reply.proposal, usage=reply.usage)
