"""Reflection through the public API: an agent and its critic, both scripted models."""

from __future__ import annotations

from typing import Any

import trio

from aggregates.invocation import CritiqueReturned, DecisionProposed
from loop_actors import (
    Agent,
    Budget,
    Critic,
    CriticBudget,
    ModelRequest,
    Runtime,
    ScriptedModel,
    TerminalReason,
    Usage,
    Verdict,
    tool,
)
from loop_actors.store.read_models import open_runner
from loop_actors.store.store import EventStore
from projections import load_trajectory, metrics
from tests.support.replies import calls, final

MEMORY = "memory://"
ACCEPT = {"kind": "accept"}


def revise(critique: str) -> dict[str, str]:
    return {"kind": "revise", "critique": critique}


@tool
def count_stock(item: str) -> int:
    """How many of an item are in stock."""
    return {"pear": 42}.get(item, 0)


class Writer:
    """The agent's model: counts, answers vaguely, and gives the count once criticised."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> dict[str, Any]:
        self.requests.append(request)
        if request.step == 1:
            return calls(("n", "count_stock", {"item": "pear"}))
        if request.turns[-1].critique is not None:
            return final(f"There are {request.results[-1].output} pears.")
        return final("Plenty of pears.")


class Reviewer:
    """A critic's model answering its script by round (the request's step)."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> Any:
        self.requests.append(request)
        reply = self.replies[request.step - 1]
        if isinstance(reply, BaseException):
            raise reply
        return reply


def agent_with(reviewer: Reviewer, writer: Writer | None = None, **critic: Any) -> Agent:
    return Agent(
        "stock",
        ScriptedModel(writer or Writer(), usage=Usage(input_tokens=100, output_tokens=10)),
        tools=[count_stock],
        critic=Critic(
            ScriptedModel(reviewer, usage=Usage(input_tokens=70, output_tokens=5)), **critic
        ),
    )


async def run(agent: Agent, url: str = MEMORY) -> tuple[Any, list[Any]]:
    with trio.fail_after(20):
        async with Runtime(url) as runtime:
            outcome = await runtime.run(agent, "How many pears?", invocation_id="r-1")
            events = await runtime.history("r-1")
    return outcome, events


def verdicts(events: list[Any]) -> list[tuple[int, int, Verdict]]:
    return [(e.step, e.round, e.verdict) for e in events if isinstance(e, CritiqueReturned)]


async def test_an_accepted_answer_completes_after_one_round() -> None:
    reviewer = Reviewer(ACCEPT)

    outcome, events = await run(agent_with(reviewer))

    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.answer == "Plenty of pears."
    assert verdicts(events) == [(2, 1, Verdict.ACCEPT)]
    assert outcome.critic is not None
    assert (outcome.critic.rounds, outcome.critic.verdicts) == (1, [Verdict.ACCEPT])


async def test_the_critic_is_asked_read_only_with_the_answer_under_review() -> None:
    reviewer = Reviewer(ACCEPT)

    await run(agent_with(reviewer))

    (request,) = reviewer.requests
    assert request.tools == []
    assert request.review == "Plenty of pears."
    assert request.step == 1  # its round
    assert request.goal == "How many pears?"
    assert [t.step for t in request.turns] == [1, 2]
    assert len(request.notices) == 1  # its instructions
    assert request.notices[0].startswith("You are a critic.")


async def test_a_revise_verdict_reaches_the_agents_model_then_the_revised_answer_stands() -> None:
    writer, reviewer = Writer(), Reviewer(revise("Say how many."), ACCEPT)

    outcome, events = await run(agent_with(reviewer, writer))

    assert outcome.answer == "There are 42 pears."
    assert outcome.steps == 3
    assert verdicts(events) == [(2, 1, Verdict.REVISE), (3, 2, Verdict.ACCEPT)]
    asked_again = writer.requests[-1]
    assert asked_again.turns[-1].critique == "Say how many."
    assert any("Say how many." in notice for notice in asked_again.notices)
    assert reviewer.requests[1].review == "There are 42 pears."


async def test_max_rounds_reached_lets_the_last_answer_stand() -> None:
    reviewer = Reviewer(revise("No."))

    outcome, events = await run(agent_with(reviewer, max_rounds=1))

    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.answer == "There are 42 pears."
    assert (
        outcome.detail == "not reviewed again: the critic's 1 round(s) are spent (the last: revise)"
    )
    assert verdicts(events) == [(2, 1, Verdict.REVISE)]


async def test_a_malformed_reply_is_a_spent_round_recorded_with_its_problem() -> None:
    reviewer = Reviewer("Looks fine to me!", ACCEPT)

    outcome, events = await run(agent_with(reviewer))

    assert outcome.answer == "Plenty of pears."
    assert verdicts(events) == [(2, 1, Verdict.MALFORMED), (2, 2, Verdict.ACCEPT)]
    malformed = next(e for e in events if isinstance(e, CritiqueReturned))
    assert malformed.problem is not None
    assert "not a JSON verdict" in malformed.problem


async def test_a_critic_model_that_raises_is_a_failed_round_and_the_answer_stands() -> None:
    reviewer = Reviewer(ConnectionError("the critic's provider is down"))

    outcome, events = await run(agent_with(reviewer, max_rounds=1))

    assert outcome.reason is TerminalReason.COMPLETED
    assert verdicts(events) == [(2, 1, Verdict.FAILED)]
    failed = next(e for e in events if isinstance(e, CritiqueReturned))
    assert failed.problem == (
        "the critic's model raised ConnectionError: the critic's provider is down"
    )


async def test_the_critics_usage_counts_against_its_budget_not_the_agents() -> None:
    """The agent may use 400 tokens: its own 330 fit, the critic's 150 are not among them."""
    writer, reviewer = Writer(), Reviewer(revise("Say how many."), ACCEPT)
    agent = Agent(
        "stock",
        ScriptedModel(writer, usage=Usage(input_tokens=100, output_tokens=10)),
        tools=[count_stock],
        budget=Budget(max_tokens=400),
        critic=Critic(
            ScriptedModel(reviewer, usage=Usage(input_tokens=70, output_tokens=5)),
            budget=CriticBudget(max_tokens=1_000),
        ),
    )

    outcome, events = await run(agent)

    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.critic is not None
    assert (outcome.critic.input_tokens, outcome.critic.output_tokens) == (140, 10)
    agent_tokens = sum(
        e.usage.input_tokens + e.usage.output_tokens
        for e in events
        if isinstance(e, DecisionProposed)
    )
    assert agent_tokens == 330


async def test_a_spent_critic_budget_stops_its_rounds_and_the_answer_stands() -> None:
    reviewer = Reviewer(revise("Say how many."), ACCEPT)

    outcome, events = await run(
        agent_with(reviewer, max_rounds=5, budget=CriticBudget(max_tokens=50))
    )

    assert outcome.answer == "There are 42 pears."
    assert outcome.detail == "not reviewed again: the critic's budget is spent (75 of 50 tokens)"
    assert verdicts(events) == [(2, 1, Verdict.REVISE)]


async def test_an_agent_without_a_critic_reports_none() -> None:
    outcome, _ = await run(Agent("plain", ScriptedModel([final("done")])))

    assert outcome.critic is None


async def test_the_read_models_show_the_critics_rounds_and_usage_apart(db_url: str) -> None:
    await run(agent_with(Reviewer(revise("Say how many."), ACCEPT)), db_url)

    store = EventStore(db_url, create=False)
    runner = open_runner(store)
    try:
        runner.catch_up()
        trajectory = load_trajectory(runner, "r-1")
        (row,) = metrics(runner, "agent")
    finally:
        runner.close()
        store.close()

    assert trajectory is not None
    assert [(c.round, c.step, c.verdict, c.critique) for c in trajectory.critiques] == [
        (1, 2, "revise", "Say how many."),
        (2, 3, "accept", None),
    ]
    assert (trajectory.input_tokens, trajectory.critic_input_tokens) == (300, 140)
    assert (row.input_tokens, row.critique_rounds, row.critic_input_tokens) == (300, 2, 140)


async def test_a_replay_follows_the_recorded_verdicts_without_asking_the_critic(
    db_url: str,
) -> None:
    await run(agent_with(Reviewer(revise("Say how many."), ACCEPT)), db_url)
    untouched = Reviewer()  # a critic with no reply: asking it would fail the replay

    with trio.fail_after(20):
        async with Runtime(db_url) as runtime:
            report = await runtime.replay(agent_with(untouched), ["r-1"])

    (result,) = report.results
    assert result.identical, result.divergences
    assert result.replayed is TerminalReason.COMPLETED
    assert untouched.requests == []
