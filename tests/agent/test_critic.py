"""The Critic's arguments: what a critic is made of, and what is refused."""

from __future__ import annotations

import pytest

from loop_actors import Agent, Critic, CriticBudget, Price, ScriptedModel, UsageError

ACCEPT = {"kind": "accept"}


def test_a_critics_settings_are_what_each_run_records() -> None:
    critic = Critic(
        ScriptedModel([ACCEPT]), max_rounds=3, budget=CriticBudget(max_cost=0.5), price=Price()
    )
    agent = Agent("a", ScriptedModel([ACCEPT]), critic=critic)

    assert agent.settings.critic == critic.settings
    assert (critic.max_rounds, critic.budget.max_cost) == (3, 0.5)
    assert agent.with_critic(None).settings.critic is None
    assert agent.with_critic(None).critic is None


def test_a_critic_with_malformed_settings_is_refused() -> None:
    """max_rounds 0, a budget that is not a CriticBudget, a model without decide()."""
    model = ScriptedModel([ACCEPT])
    with pytest.raises(UsageError, match="max_rounds"):
        Critic(model, max_rounds=0)
    with pytest.raises(UsageError, match="CriticBudget"):
        Critic(model, budget={"max_tokens": 10})  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="decide"):
        Critic(object())  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="must be a Critic"):
        Agent("a", model, critic=model)  # type: ignore[arg-type]
