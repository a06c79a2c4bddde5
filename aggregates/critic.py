"""Reflection: the rules of a critic's rounds on a final answer, with no I/O.

An agent with a critic (``Agent(..., critic=Critic(model, max_rounds=2))``) has each
final answer that passed its verifier reviewed by a second model, the critic, before
the run completes. The critic is read-only: it is offered no tool, and sees the goal,
the committed turns and the answer. Its reply is a verdict (:data:`CriticReply`):

* ``{"kind": "accept"}``: the answer stands, the run completes;
* ``{"kind": "revise", "critique": "..."}``: the answer goes back to the agent's model,
  the critique in its turn and in a notice of its next request.

Each round is recorded (``CritiqueReturned``) before the loop moves on. A reply that is
no verdict (:class:`MalformedVerdict`) and a critic call that failed are recorded too:
such a round is spent, the answer is not sent back, and the critic is asked again while
rounds remain. The critic is asked at most ``max_rounds`` times; once they are spent
(or its own budget is, or the agent has nothing left to revise with, or the deadline
passed), the answer stands: the run completes with a detail that says why the answer
was not reviewed again. The critic's usage is counted apart from the agent's
(:class:`CriticSpent`): it never counts against the agent's budget, only its own.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from aggregates.decisions import Frozen, Price, Usage
from aggregates.revalidation import validation_problems
from aggregates.values import NotJsonError, UnstorableError, parse_json_text, safe_text

MAX_CRITIQUE_CHARS = 8_000
"""The longest critique stored (and shown to the agent's model); a longer one is cut."""

DEFAULT_CRITIC_INSTRUCTIONS = (
    "You are a critic. Review the final answer given to the user's goal, in the light of "
    "the work shown. Do not do the work yourself. Reply with one JSON object and nothing "
    'else: {"kind": "accept"} when the answer is right and complete, or '
    '{"kind": "revise", "critique": "what is wrong and what to change"} when it is not.'
)
"""What the critic's model is told (its request's notice; recorded with the run)."""

REVISION_NOTICE = (
    "A critic reviewed your final answer and asks for a revision: {critique} "
    "Give your final answer again, revised."
)
"""What the agent's model is told after a ``revise`` verdict (``{critique}`` filled in)."""


class CriticBudget(Frozen):
    """The critic's own limits, counted apart from the agent's budget.

    Before each round the critic's usage so far is compared with them: once it reached
    a limit, the critic is not asked again and the answer stands. One call may pass a
    limit (its usage is known only once it answered): at most one round's overshoot.
    """

    max_tokens: Annotated[int, Field(ge=1)] | None = None
    """The most input and output tokens the critic may use in all its rounds."""
    max_cost: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """The most the critic may cost in all its rounds."""


class CriticSettings(Frozen):
    """A critic's recorded settings (``RunSettings.critic``): followed on resume."""

    max_rounds: Annotated[int, Field(ge=1)] = 2
    """The most times the critic is asked for a verdict in one invocation."""
    budget: CriticBudget = CriticBudget()
    price: Price | None = None
    """Turns the critic's token usage into cost when its model reports none."""
    instructions: str = DEFAULT_CRITIC_INSTRUCTIONS


class Verdict(StrEnum):
    """What a critic's round gave."""

    ACCEPT = "accept"
    """The critic accepts the answer: it stands."""
    REVISE = "revise"
    """The critic asks for a revision: the answer goes back to the agent's model."""
    MALFORMED = "malformed"
    """The critic's reply was no verdict (:class:`MalformedVerdict`): a spent round."""
    FAILED = "failed"
    """The critic's model failed (it raised, had no quota, reported an unusable usage):
    a spent round."""


class Accept(Frozen):
    """The critic's verdict that the answer stands."""

    kind: Literal["accept"] = "accept"


class Revise(Frozen):
    """The critic's verdict that the answer must change, and how."""

    kind: Literal["revise"] = "revise"
    critique: str


CriticReply = Annotated[Accept | Revise, Field(discriminator="kind")]
"""The verdicts a critic may reply with."""

_REPLY: TypeAdapter[Accept | Revise] = TypeAdapter(CriticReply)


class MalformedVerdict(Frozen):
    """A critic's reply that is no verdict, and why (recorded as a ``malformed`` round)."""

    problems: list[str]


def read_verdict(proposal: object) -> Accept | Revise | MalformedVerdict:
    """A critic's untrusted reply as its verdict, or why it is none.

    The reply may be a verdict (a model or its JSON shape, or JSON text), or a final
    answer whose text is the JSON of one (what a provider's model replies in plain text
    gives). A ``revise`` verdict needs a critique that is not blank; it is stored cut to
    :data:`MAX_CRITIQUE_CHARS`.
    """
    value = _plain(proposal)
    if isinstance(value, MalformedVerdict):
        return value
    if isinstance(value, dict) and value.get("kind") == "final":
        answer = value.get("answer")
        inner = _plain(_unfenced(answer)) if isinstance(answer, str) else None
        if not isinstance(inner, dict):
            return MalformedVerdict(
                problems=["the reply is a final answer, not a verdict (accept or revise)"]
            )
        value = inner
    try:
        reply = _REPLY.validate_python(value)
    except ValidationError as error:
        return MalformedVerdict(problems=validation_problems(error, whole="verdict"))
    if isinstance(reply, Revise):
        if not reply.critique.strip():
            return MalformedVerdict(problems=["a revise verdict needs a critique"])
        return Revise(critique=safe_text(reply.critique, limit=MAX_CRITIQUE_CHARS))
    return reply


def _plain(proposal: object) -> Any:
    """The reply as plain data: JSON text parsed, a model dumped (or why it cannot be)."""
    if isinstance(proposal, str | bytes):
        try:
            return parse_json_text(proposal)
        except (NotJsonError, UnstorableError) as error:
            return MalformedVerdict(problems=[f"the reply is not a JSON verdict: {error}"])
    if isinstance(proposal, BaseModel):
        try:
            return to_jsonable_python(proposal)
        except Exception as error:  # a model built without validation may not dump
            return MalformedVerdict(problems=[f"the reply cannot be read: {safe_text(error)}"])
    return proposal


def _unfenced(text: str) -> str:
    """A JSON text as a model may wrap it (in a Markdown code fence), unwrapped."""
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```") and len(stripped) > 6:
        body = stripped[3:-3]
        first, _, rest = body.partition("\n")
        return rest if first.strip().isalpha() or not first.strip() else body
    return stripped


class CriticSpent(Frozen):
    """What an invocation's critic did: its rounds, their verdicts and its usage.

    Kept apart from the agent's own usage (the invocation's tokens and cost).
    """

    rounds: int = 0
    verdicts: list[Verdict] = []
    """Each round's verdict, in order."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0

    @property
    def tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens

    def plus(self, verdict: Verdict, usage: Usage) -> CriticSpent:
        """After one more round."""
        return CriticSpent(
            rounds=self.rounds + 1,
            verdicts=[*self.verdicts, verdict],
            input_tokens=self.input_tokens + usage.input_tokens,
            output_tokens=self.output_tokens + usage.output_tokens,
            cost=self.cost + usage.cost,
        )


NO_CRITIC = CriticSpent()


def not_asked_because(spent: CriticSpent, settings: CriticSettings) -> str | None:
    """Why the critic is not asked again (its rounds or its budget are spent); None: it is.

    Said as the detail of the ``completed`` outcome whose answer then stands unreviewed.
    """
    if spent.rounds >= settings.max_rounds:
        last = spent.verdicts[-1] if spent.verdicts else None
        after = f" (the last: {last.value})" if last is not None else ""
        return f"not reviewed again: the critic's {settings.max_rounds} round(s) are spent{after}"
    budget = settings.budget
    if budget.max_tokens is not None and spent.tokens >= budget.max_tokens:
        return (
            "not reviewed again: the critic's budget is spent "
            f"({spent.tokens} of {budget.max_tokens} tokens)"
        )
    if budget.max_cost is not None and spent.cost >= budget.max_cost:
        return (
            "not reviewed again: the critic's budget is spent "
            f"({spent.cost:.6f} of {budget.max_cost:.6f})"
        )
    return None


def revision_notice(critique: str) -> str:
    """What the agent's model is told after a ``revise`` verdict."""
    return REVISION_NOTICE.format(critique=critique)


def verdict_json(reply: Accept | Revise) -> str:
    """A verdict as the JSON text a critic replies with (for scripted critics, replay)."""
    return json.dumps(reply.model_dump(mode="json"))
