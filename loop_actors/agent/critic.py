"""The Critic: a second model that reviews an agent's final answers (reflection).

Its rules (rounds, budget, what a verdict does) are the turn core's
(:mod:`aggregates.critic`, :mod:`aggregates.turn_critic`); this is the part that
holds what a record cannot: the model.
"""

from __future__ import annotations

from typing import TypeVar

from aggregates.critic import DEFAULT_CRITIC_INSTRUCTIONS, CriticBudget, CriticSettings
from aggregates.decisions import Price
from aggregates.revalidation import MalformedValueError, revalidated
from loop_actors._errors import UsageError
from loop_actors.agent.model import Model

_T = TypeVar("_T", CriticBudget, Price)


class Critic:
    """A read-only reviewer of an agent's final answers: ``Agent(..., critic=Critic(model))``.

    After each final answer (that passed the agent's verifier, if it has one) the critic's
    model is asked for a verdict: ``{"kind": "accept"}`` lets the answer stand,
    ``{"kind": "revise", "critique": "..."}`` sends it back to the agent's model with the
    critique. It is offered no tool. See docs/how-to/add-a-critic.md.
    """

    __slots__ = ("model", "settings")

    def __init__(
        self,
        model: Model | str,
        max_rounds: int = 2,
        budget: CriticBudget | None = None,
        *,
        price: Price | None = None,
        instructions: str = DEFAULT_CRITIC_INSTRUCTIONS,
    ) -> None:
        """Describe a critic.

        Args:
            model: what reviews the answers (a :class:`ScriptedModel` or an adapter, or a
                name such as ``"openai:gpt-4.1"``). Its request's ``step`` is the round
                (1, 2, ...), ``review`` the answer under review, ``tools`` empty.
            max_rounds: the most times it is asked for a verdict in one invocation; once
                they are spent the last answer stands.
            budget: its own token and cost limits (:class:`CriticBudget`), counted apart
                from the agent's budget, which its usage never counts against.
            price: turns its token usage into cost when its model reports none.
            instructions: what its model is told (a notice of its request).

        The settings (not the model) are recorded with each run; a resume follows them.

        Raises:
            UsageError: a malformed argument.
        """
        if isinstance(model, str):
            # The providers' adapters, imported for a model named by a string only (issue 32).
            from loop_actors.agent.adapters import model_from_name  # noqa: PLC0415

            model = model_from_name(model)
        if not callable(getattr(model, "decide", None)):
            raise UsageError("a critic's model must have an async decide(request) method")
        if type(max_rounds) is not int or max_rounds < 1:
            raise UsageError(f"a critic's max_rounds must be an integer >= 1, got {max_rounds!r}")
        if not isinstance(instructions, str) or not instructions.strip():
            raise UsageError("a critic's instructions must be a non-empty text")
        try:
            settings = CriticSettings(
                max_rounds=max_rounds,
                budget=_revalidated(CriticBudget, budget, "budget") or CriticBudget(),
                price=_revalidated(Price, price, "price"),
                instructions=instructions,
            )
        except ValueError as error:  # pydantic's ValidationError is one
            raise UsageError(f"a critic's settings are invalid: {error}") from None
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "settings", settings)

    model: Model
    settings: CriticSettings
    """What is recorded with each run (rounds, budget, price, instructions)."""

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Critic is frozen: build a new one to change {name!r}")

    @property
    def max_rounds(self) -> int:
        """The most rounds in one invocation."""
        return self.settings.max_rounds

    @property
    def budget(self) -> CriticBudget:
        """Its own limits."""
        return self.settings.budget

    def with_model(self, model: Model | str) -> Critic:
        """The same critic with another model."""
        s = self.settings
        return Critic(model, s.max_rounds, s.budget, price=s.price, instructions=s.instructions)

    def __repr__(self) -> str:
        return f"Critic(max_rounds={self.max_rounds})"


def _revalidated(cls: type[_T], value: object, name: str) -> _T | None:
    if value is None:
        return None
    if not isinstance(value, cls):
        raise UsageError(f"a critic's {name} must be a {cls.__name__}")
    try:
        return revalidated(cls, value)
    except MalformedValueError as error:
        raise UsageError(f"a critic's {name} is {error}") from None
