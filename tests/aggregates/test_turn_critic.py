"""The turn core's reflection rules, driven directly: a critic's rounds on a final answer."""

from __future__ import annotations

from datetime import timedelta

import pytest

from aggregates.critic import (
    Accept,
    CriticBudget,
    CriticSettings,
    MalformedVerdict,
    Revise,
    Verdict,
    read_verdict,
)
from aggregates.decisions import Budget, Clarification, Final, Price, TerminalReason, Usage
from aggregates.errors import IllegalTransitionError
from aggregates.invocation import CritiqueReturned, Phase
from aggregates.ledger_check import cut_decision_problem
from aggregates.settings import RunSettings
from aggregates.turn import (
    AskModel,
    Critique,
    Finished,
    ModelAnswered,
    ModelFailed,
    ModelInterrupted,
    ModelQuotaWait,
    ModelTimedOut,
    Moment,
    RunCalls,
    Verify,
)
from tests.support.replies import calls, final
from tests.support.turn_core import AT, Shell, ok, replayed_invocation, types
from tests.support.turn_core import Verdict as VerifierVerdict

ACCEPT = {"kind": "accept"}


def revise(critique: str) -> dict[str, str]:
    return {"kind": "revise", "critique": critique}


def with_critic(max_rounds: int = 2, **options: object) -> RunSettings:
    return RunSettings(critic=CriticSettings(max_rounds=max_rounds, **options))


def critiques(shell: Shell) -> list[CritiqueReturned]:
    return shell.of_type(CritiqueReturned)


# --------------------------------------------------------------------------- the rounds


def test_an_answer_the_critic_accepts_completes_after_its_verdict() -> None:
    shell = Shell.over(settings=with_critic())
    shell.begin()

    critique = shell.answer(final("42"))

    assert isinstance(critique, Critique)
    assert (critique.round, critique.step, critique.answer) == (1, 1, "42")
    # The answer is durable before the critic is asked.
    assert types(shell.committed) == ["InvocationStarted", "DecisionProposed"]
    assert shell.feed(ModelAnswered(ACCEPT, usage=Usage(input_tokens=30))) == Finished(
        completed=True
    )
    assert shell.terminated.reason is TerminalReason.COMPLETED
    assert shell.terminated.answer == "42"
    assert shell.terminated.detail is None
    assert [(c.round, c.verdict, c.critique) for c in critiques(shell)] == [
        (1, Verdict.ACCEPT, None)
    ]
    assert types(shell.committed)[-2:] == ["CritiqueReturned", "Terminated"]


def test_a_revise_verdict_sends_the_answer_back_with_the_critique_as_a_notice() -> None:
    shell = Shell.over(settings=with_critic())
    shell.begin()
    shell.answer(final("about 40"))

    ask = shell.feed(ModelAnswered(revise("give the exact count")))

    assert isinstance(ask, AskModel)
    assert ask.step == 2
    assert ask.turns[-1].critique == "give the exact count"
    assert any("give the exact count" in notice for notice in ask.notices)
    assert shell.invocation.phase is Phase.READY
    # The verdict was committed before the model is asked again.
    assert types(shell.committed)[-1] == "CritiqueReturned"


def test_revise_then_accept_completes_with_the_revised_answer() -> None:
    shell = Shell.over(settings=with_critic())

    action = shell.run(
        [
            ModelAnswered(final("about 40")),
            ModelAnswered(revise("give the exact count")),
            ModelAnswered(final("42")),
            ModelAnswered(ACCEPT),
        ]
    )

    assert action == Finished(completed=True)
    assert shell.terminated.answer == "42"
    assert [(c.step, c.round, c.verdict) for c in critiques(shell)] == [
        (1, 1, Verdict.REVISE),
        (2, 2, Verdict.ACCEPT),
    ]
    assert shell.invocation.critic_spent.verdicts == [Verdict.REVISE, Verdict.ACCEPT]


def test_the_notice_is_given_only_right_after_the_revise_verdict() -> None:
    shell = Shell.over(settings=with_critic(max_rounds=3))
    shell.run([ModelAnswered(final("about 40")), ModelAnswered(revise("count them"))])
    run = shell.answer(calls(("c1", "search", {"q": "pears"})))
    assert isinstance(run, RunCalls)

    ask = shell.ran(ok(run.calls[0]))

    assert isinstance(ask, AskModel)
    assert ask.step == 3
    assert not any("count them" in notice for notice in ask.notices)


def test_max_rounds_reached_lets_the_last_answer_stand_unreviewed() -> None:
    shell = Shell.over(settings=with_critic(max_rounds=2))

    action = shell.run(
        [
            ModelAnswered(final("a")),
            ModelAnswered(revise("no")),
            ModelAnswered(final("b")),
            ModelAnswered(revise("still no")),
            ModelAnswered(final("c")),
        ]
    )

    assert action == Finished(completed=True)
    assert shell.terminated.answer == "c"
    assert shell.terminated.detail == (
        "not reviewed again: the critic's 2 round(s) are spent (the last: revise)"
    )
    assert [c.verdict for c in critiques(shell)] == [Verdict.REVISE, Verdict.REVISE]


def test_a_malformed_verdict_is_a_spent_round_and_the_critic_is_asked_again() -> None:
    shell = Shell.over(settings=with_critic(max_rounds=2))
    shell.begin()
    shell.answer(final("42"))

    again = shell.feed(ModelAnswered({"kind": "looks good to me"}))

    assert isinstance(again, Critique)
    assert again.round == 2
    assert again.answer == "42"  # nothing went back to the agent's model
    (round_1,) = critiques(shell)  # committed before the second round
    assert round_1.verdict is Verdict.MALFORMED
    assert round_1.problem is not None
    assert "verdict" in round_1.problem
    assert shell.feed(ModelAnswered(ACCEPT)) == Finished(completed=True)
    assert shell.terminated.answer == "42"


def test_malformed_verdicts_until_max_rounds_let_the_answer_stand() -> None:
    shell = Shell.over(settings=with_critic(max_rounds=2))

    action = shell.run(
        [
            ModelAnswered(final("42")),
            ModelAnswered("I think it is fine"),
            ModelAnswered({"kind": "revise", "critique": "   "}),
        ]
    )

    assert action == Finished(completed=True)
    assert shell.terminated.answer == "42"
    assert shell.terminated.detail == (
        "not reviewed again: the critic's 2 round(s) are spent (the last: malformed)"
    )
    assert [c.problem for c in critiques(shell)][1] == "a revise verdict needs a critique"


def test_a_critic_model_that_raises_is_a_failed_round() -> None:
    shell = Shell.over(settings=with_critic(max_rounds=1))
    shell.begin()
    shell.answer(final("42"))

    action = shell.feed(ModelFailed(error_type="ConnectionError", message="no route"))

    assert action == Finished(completed=True)
    (failed,) = critiques(shell)
    assert failed.verdict is Verdict.FAILED
    assert failed.problem == "the critic's model raised ConnectionError: no route"


def test_a_critic_without_quota_is_a_failed_round() -> None:
    shell = Shell.over(settings=with_critic(max_rounds=1))
    shell.begin()
    shell.answer(final("42"))

    shell.feed(ModelQuotaWait(until=AT + timedelta(minutes=1), limit="openai:gpt"))

    assert critiques(shell)[0].verdict is Verdict.FAILED
    assert shell.terminated.reason is TerminalReason.COMPLETED


def test_a_critic_usage_that_cannot_be_recorded_is_a_failed_round() -> None:
    """A usage of NaN tokens is refused where it enters: the round records none."""
    shell = Shell.over(settings=with_critic(max_rounds=1))
    shell.begin()
    shell.answer(final("42"))

    shell.feed(ModelAnswered(ACCEPT, usage={"input_tokens": float("nan")}))

    (failed,) = critiques(shell)
    assert failed.verdict is Verdict.FAILED
    assert failed.usage == Usage()


# --------------------------------------------------------------------------- stops


def test_a_cancel_while_the_critic_reviews_ends_cancelled() -> None:
    shell = Shell.over(settings=with_critic())
    shell.begin()
    shell.answer(final("42"))

    shell.feed(ModelInterrupted())

    assert shell.terminated.reason is TerminalReason.CANCELLED
    assert not critiques(shell)


def test_the_deadline_passing_while_the_critic_reviews_lets_the_answer_stand() -> None:
    shell = Shell.over(settings=with_critic())
    shell.begin()
    shell.answer(final("42"))

    shell.feed(ModelTimedOut())

    assert shell.terminated.reason is TerminalReason.COMPLETED
    assert shell.terminated.detail == "not reviewed: the deadline passed while the critic reviewed"


def test_the_critic_is_not_asked_when_the_agent_has_no_step_left_to_revise() -> None:
    shell = Shell.over(settings=with_critic(), budget=Budget(max_steps=1))
    shell.begin()

    action = shell.answer(final("42"))

    assert action == Finished(completed=True)
    assert shell.terminated.detail == "not reviewed: no step is left for a revision"
    assert not critiques(shell)


def test_the_critics_own_token_budget_stops_its_rounds_not_the_agent() -> None:
    settings = with_critic(max_rounds=5, budget=CriticBudget(max_tokens=100))
    shell = Shell.over(settings=settings, budget=Budget(max_tokens=1_000))

    shell.run(
        [
            ModelAnswered(final("a"), usage=Usage(input_tokens=10)),
            ModelAnswered(revise("no"), usage=Usage(input_tokens=120)),  # one round's overshoot
            ModelAnswered(final("b"), usage=Usage(input_tokens=10)),
        ]
    )

    assert shell.terminated.answer == "b"
    assert shell.terminated.detail == (
        "not reviewed again: the critic's budget is spent (120 of 100 tokens)"
    )
    inv = shell.invocation
    # Counted apart: the agent's 20 tokens, the critic's 120.
    assert (inv.input_tokens, inv.critic_spent.input_tokens) == (20, 120)


def test_the_critics_price_turns_its_tokens_into_its_own_cost() -> None:
    settings = with_critic(price=Price(input_per_million=1_000_000))
    shell = Shell.over(settings=settings)

    shell.run([ModelAnswered(final("a")), ModelAnswered(ACCEPT, usage=Usage(input_tokens=3))])

    assert shell.invocation.critic_spent.cost == 3.0
    assert shell.invocation.cost == 0.0


def test_a_run_whose_shell_has_no_critic_completes_unreviewed() -> None:
    shell = Shell.over(settings=with_critic(), critiques=False)
    shell.begin()

    shell.answer(final("42"))

    assert shell.terminated.detail == "not reviewed: the agent that drives this run has no critic"


# --------------------------------------------------------------------------- with a verifier


def test_the_verifier_gates_each_answer_before_the_critic_sees_it() -> None:
    shell = Shell.over(settings=with_critic(), verifies=True)
    shell.begin()

    assert isinstance(shell.answer(final("about 40")), Verify)
    assert isinstance(shell.feed(VerifierVerdict("no count")), AskModel)
    assert isinstance(shell.answer(final("42")), Verify)
    critique = shell.feed(VerifierVerdict(None))

    assert isinstance(critique, Critique)
    assert critique.answer == "42"


# --------------------------------------------------------------------------- resume


def _resumed(shell: Shell) -> Shell:
    """The same history as a later run loads it, driven by a new core."""
    return Shell.over(replayed_invocation(shell.committed), settings=shell.core.settings)


def test_a_run_stopped_between_the_answer_and_the_verdict_asks_the_critic_again() -> None:
    shell = Shell.over(settings=with_critic())
    shell.begin()
    shell.answer(final("42"))  # the answer is committed; the critic's reply never came

    resumed = _resumed(shell)
    action = resumed.begin()

    assert isinstance(action, Critique)
    assert (action.round, action.answer) == (1, "42")
    assert cut_decision_problem(resumed.invocation) is None  # not a cut history


def test_a_run_stopped_after_a_revise_verdict_asks_the_agent_with_the_notice() -> None:
    shell = Shell.over(settings=with_critic())
    shell.run([ModelAnswered(final("about 40")), ModelAnswered(revise("exact count"))])

    action = _resumed(shell).begin()

    assert isinstance(action, AskModel)
    assert action.step == 2
    assert any("exact count" in notice for notice in action.notices)


def test_a_run_stopped_after_a_malformed_round_asks_for_the_next_round() -> None:
    shell = Shell.over(settings=with_critic(max_rounds=3))
    shell.run([ModelAnswered(final("42")), ModelAnswered("?")])

    action = _resumed(shell).begin()

    assert isinstance(action, Critique)
    assert action.round == 2


def test_a_resume_with_a_cancel_request_ends_cancelled_without_the_critic() -> None:
    shell = Shell.over(settings=with_critic())
    shell.begin()
    shell.answer(final("42"))
    resumed = _resumed(shell)
    resumed.now = Moment(at=AT, elapsed_s=0.0, cancel_requested=True)

    resumed.begin()

    assert resumed.terminated.reason is TerminalReason.CANCELLED


def test_a_committed_answer_without_a_critic_is_still_a_cut_history() -> None:
    shell = Shell.over(settings=with_critic())
    shell.begin()
    shell.answer(final("42"))
    invocation = replayed_invocation(shell.committed)
    object.__setattr__(invocation, "settings", RunSettings())

    assert cut_decision_problem(invocation) is not None


# --------------------------------------------------------------------------- the aggregate


def test_a_verdict_on_anything_but_a_final_answer_is_refused() -> None:
    inv = Shell.over(settings=with_critic()).invocation
    inv.propose(Clarification(question="which?"), usage=Usage(), at=AT)  # decided, not paused

    with pytest.raises(IllegalTransitionError, match="only a proposed final answer"):
        inv.record_critique(Verdict.ACCEPT, usage=Usage(), at=AT)


def test_a_revise_verdict_without_a_critique_is_refused() -> None:
    shell = Shell.over(settings=with_critic())
    shell.begin()
    shell.answer(final("42"))

    with pytest.raises(IllegalTransitionError, match="critique comes with a revise"):
        shell.invocation.record_critique(Verdict.REVISE, usage=Usage(), at=AT)
    with pytest.raises(IllegalTransitionError, match="problem comes with"):
        shell.invocation.record_critique(Verdict.MALFORMED, usage=Usage(), at=AT)


# --------------------------------------------------------------------------- the reply


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ({"kind": "accept"}, Accept()),
        (Accept(), Accept()),
        ('{"kind": "revise", "critique": "shorter"}', Revise(critique="shorter")),
        # A provider's plain-text reply arrives as a final answer holding the JSON.
        ({"kind": "final", "answer": '{"kind": "accept"}'}, Accept()),
        (Final(answer='```json\n{"kind": "accept"}\n```'), Accept()),
    ],
)
def test_a_verdict_is_read_from_each_shape_a_critic_replies_with(
    reply: object, verdict: Accept | Revise
) -> None:
    assert read_verdict(reply) == verdict


@pytest.mark.parametrize(
    "reply",
    [
        {"kind": "approve"},
        {"kind": "final", "answer": "Looks right."},
        "not json",
        {"kind": "revise"},
        {"kind": "revise", "critique": ""},
        {"kind": "tool_calls", "calls": []},
        None,
    ],
)
def test_a_reply_that_is_no_verdict_is_a_typed_malformed_verdict(reply: object) -> None:
    """Unknown kinds, plain text, a revise without critique, a tool call: MalformedVerdict."""
    malformed = read_verdict(reply)

    assert isinstance(malformed, MalformedVerdict)
    assert malformed.problems


def test_a_long_critique_is_stored_cut() -> None:
    verdict = read_verdict(revise("x" * 20_000))

    assert isinstance(verdict, Revise)
    assert len(verdict.critique) < 8_100
