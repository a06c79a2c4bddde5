"""The turn core (``aggregates.turn``) driven directly, without trio: one behaviour per test.

A :class:`Shell` (in ``tests/support/turn_core.py``) stands in for ``loop_actors``: it
hands the core scripted observations, commits (collects) the pending events where an
action says ``commits_first``, and follows ``Continue`` by asking for the next action.
The tools are a :class:`FakeCatalogue` whose arguments are pydantic models, so invalid
arguments raise real ``ValidationError`` s and defaults are filled in.

Bad inputs tried: a proposal of an unknown kind, plain text, an empty final
answer, an empty batch, duplicate call ids, an unknown tool, arguments of the
wrong type, missing and unexpected arguments, a policy that stops the run,
usage past the token and cost budgets (and reservations that would pass them),
a plan repeated as is and repeated with a default spelt out, the same failure
again and again, a model that fails, times out or is interrupted, a cancel
request or a deadline at each stage, a tool budget and a repeated-plan limit
lowered while a batch waited for approval, a write whose outcome is unknown and
whose service cannot be asked or keeps answering "not found", a crash after a
batch was dispatched, failed commits, and sensitive arguments and outputs.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from aggregates.decisions import (
    Budget,
    EffectStatus,
    ErrorClass,
    Price,
    RejectionClass,
    TerminalReason,
    ToolCalls,
    ToolEffect,
    Usage,
)
from aggregates.effect import (
    EffectDispatched,
    EffectEvent,
    EffectOutcomeUnknown,
    EffectReconciled,
    Resolution,
)
from aggregates.invocation import (
    BatchDispatched,
    ContextCompacted,
    DecisionProposed,
    Phase,
    ResultsCommitted,
    Terminated,
    VerificationFailed,
)
from aggregates.results import Interruption, interrupted_result
from aggregates.settings import RunSettings
from aggregates.turn import (
    MAX_DISPATCH_ROUNDS,
    Action,
    AskModel,
    AttemptStillRunning,
    Authorise,
    Continue,
    EffectAnswered,
    Finished,
    KeptSecret,
    LoadEffects,
    ModelAnswered,
    ModelFailed,
    ModelInterrupted,
    ModelTimedOut,
    Moment,
    PolicyVerdict,
    Reconcile,
    RunCalls,
    ServiceUnreachable,
    Verify,
    batch_digest,
    cancel_paused,
    record_outside_cancellation,
    stop_after_failed_commit,
)
from tests.support.replies import calls, final
from tests.support.turn_core import (
    AT,
    INV,
    REDACTED,
    TOOLS,
    Answers,
    FakeCatalogue,
    FakeTool,
    Loaded,
    SendArguments,
    Shell,
    Verdict,
    failed,
    key_of,
    ok,
    proposed,
    replayed_effect,
    replayed_invocation,
    types,
    unknown,
)


def to_write_and_read() -> dict[str, Any]:
    return calls(("c1", "search", {"q": "x"}), ("c2", "send", {"to": "bob"}))


# --------------------------------------------------------------------------- answers


def test_a_final_answer_completes() -> None:
    shell = Shell.over()
    shell.begin()

    action = shell.answer(final("42"))

    assert action == Finished(completed=True)
    assert shell.terminated.reason is TerminalReason.COMPLETED
    assert shell.terminated.answer == "42"
    assert shell.invocation.phase is Phase.TERMINATED
    assert types(shell.committed) == ["InvocationStarted", "DecisionProposed", "Terminated"]


def test_an_answer_completes_only_after_the_verifier_passes() -> None:
    shell = Shell.over(verifies=True)
    shell.begin()

    verify = shell.answer(final("42"))

    assert verify == Verify(answer="42", turns=list(shell.invocation.turns))
    assert shell.invocation.terminated is None
    assert shell.invocation.phase is Phase.DECIDED
    assert shell.feed(Verdict(None)) == Finished(completed=True)
    assert shell.terminated.reason is TerminalReason.COMPLETED
    assert shell.terminated.answer == "42"


def test_a_refused_answer_goes_back_to_the_model_with_the_evidence() -> None:
    shell = Shell.over(verifies=True, settings=RunSettings(max_verification_attempts=2))
    shell.begin()
    shell.answer(final("41"))

    ask = shell.feed(Verdict("41 is not the answer"))

    assert isinstance(shell.actions[-2], Continue)
    assert isinstance(ask, AskModel)
    assert ask.step == 2
    assert ask.turns[-1].verification == "41 is not the answer"
    assert [e.evidence for e in shell.of_type(VerificationFailed)] == ["41 is not the answer"]


def test_answers_refused_max_verification_attempts_times_end_verification_failed() -> None:
    shell = Shell.over(verifies=True, settings=RunSettings(max_verification_attempts=2))

    action = shell.run(
        [
            ModelAnswered(final("41")),
            Verdict("41 is not the answer"),
            ModelAnswered(final("43")),
            Verdict("43 is not the answer either"),
        ]
    )

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.VERIFICATION_FAILED
    assert shell.terminated.detail == (
        "2 answer(s) failed verification; last: 43 is not the answer either"
    )
    assert [e.attempt for e in shell.of_type(VerificationFailed)] == [1, 2]


def test_cannot_continue_ends_with_the_models_reason() -> None:
    shell = Shell.over()
    shell.begin()

    action = shell.answer({"kind": "cannot_continue", "reason": "no access to the data"})

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.CANNOT_CONTINUE
    assert shell.terminated.detail == "no access to the data"


def test_a_clarification_pauses_with_the_question() -> None:
    shell = Shell.over()
    shell.begin()

    action = shell.answer({"kind": "clarification", "question": "which x?"})

    assert action == Finished()
    assert shell.invocation.phase is Phase.AWAITING_CLARIFICATION
    assert shell.paused.reason is TerminalReason.CLARIFICATION_REQUIRED
    assert shell.paused.question == "which x?"
    assert shell.of_type(Terminated) == []


def test_a_paused_invocation_without_a_batch_has_nothing_to_do() -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer({"kind": "clarification", "question": "which x?"})

    assert shell.resume() == Finished()
    assert shell.invocation.phase is Phase.AWAITING_CLARIFICATION


def test_a_models_request_for_approval_pauses_with_its_digest() -> None:
    shell = Shell.over()
    shell.begin()

    action = shell.answer({"kind": "request_approval", "proposal_digest": "d-1"})

    assert action == Finished()
    assert shell.invocation.phase is Phase.AWAITING_APPROVAL
    assert shell.paused.reason is TerminalReason.APPROVAL_REQUIRED
    assert shell.paused.proposal_digest == "d-1"
    assert shell.paused.calls is None


# --------------------------------------------------------------------------- approvals


def to_search_and_delete() -> dict[str, Any]:
    return calls(("c1", "search", {"q": "x"}), ("c2", "delete", {"path": "reports/old.txt"}))


def test_a_tool_that_needs_approval_pauses_the_batch_before_it_is_dispatched() -> None:
    shell = Shell.over()
    shell.begin()

    action = shell.answer(to_search_and_delete())

    assert action == Finished()
    assert shell.invocation.phase is Phase.AWAITING_APPROVAL
    paused = shell.paused
    assert paused.reason is TerminalReason.APPROVAL_REQUIRED
    assert paused.calls is not None
    assert [(c.call_id, c.name, c.arguments) for c in paused.calls] == [
        ("c1", "search", {"q": "x", "limit": 10}),
        ("c2", "delete", {"path": "reports/old.txt"}),
    ]
    assert paused.needs_approval == ["c2"]
    assert paused.proposal_digest == batch_digest(INV, 1, paused.calls)
    assert shell.of_type(BatchDispatched) == []


def test_after_a_grant_the_next_action_runs_exactly_the_paused_batch() -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer(to_search_and_delete())
    paused = shell.paused
    assert paused.calls is not None
    assert paused.proposal_digest is not None
    shell.invocation.grant_approval(paused.proposal_digest, by="alice", at=AT)

    action = shell.resume()

    assert isinstance(action, RunCalls)
    assert action.first_dispatch
    assert [c.model_copy(update={"effect_key": None}) for c in action.calls] == paused.calls
    assert action.calls[1].effect_key is not None
    assert action.attempts == {"c2": 1}
    assert [c.call_id for c in shell.of_type(BatchDispatched)[0].calls] == ["c1", "c2"]


def test_a_denial_gives_denied_results_without_running_the_calls_that_needed_it() -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer(to_search_and_delete())
    assert shell.paused.proposal_digest is not None
    shell.invocation.deny_approval(
        shell.paused.proposal_digest, by="bob", reason="too risky", at=AT
    )

    run = shell.resume()
    assert isinstance(run, RunCalls)
    assert [c.call_id for c in run.calls] == ["c1"]
    action = shell.ran(ok(run.calls[0]))

    assert isinstance(action, AskModel)
    results = shell.of_type(ResultsCommitted)[0].results
    assert results[0].ok
    assert results[1].error is not None
    assert results[1].error.error_class is ErrorClass.DENIED
    assert results[1].error.message.startswith("denied by bob: too risky")
    assert shell.of_type(BatchDispatched)[0].calls[1].effect_key is None
    assert [e for e in shell.committed if isinstance(e, EffectEvent)] == []


def test_a_cancel_request_after_a_grant_ends_cancelled_without_dispatching() -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer(to_search_and_delete())
    assert shell.paused.proposal_digest is not None
    shell.invocation.grant_approval(shell.paused.proposal_digest, by="alice", at=AT)
    shell.now = Moment(at=AT, elapsed_s=1.0, cancel_requested=True, cancel_detail="ops: stop")

    action = shell.resume()

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.CANCELLED
    assert shell.terminated.detail == "cancel requested: ops: stop"
    assert shell.of_type(BatchDispatched) == []


def test_an_approved_batch_still_obeys_a_tool_budget_changed_while_it_waited() -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer(to_search_and_delete())
    assert shell.paused.proposal_digest is not None
    shell.invocation.change_settings(Budget(max_tool_calls=1), RunSettings(), at=AT, by="ops")
    shell.invocation.grant_approval(shell.paused.proposal_digest, by="alice", at=AT)

    action = shell.resume()

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.TOOL_BUDGET_EXHAUSTED
    assert shell.terminated.detail == "2 call(s) proposed, 0 of 1 used"
    assert shell.of_type(BatchDispatched) == []


def test_an_approved_batch_still_obeys_a_repeated_plan_limit_changed_while_it_waited() -> None:
    shell = Shell.over(budget=Budget(max_repeated_plan=2))
    shell.begin()
    shell.answer(calls(("c1", "delete", {"path": "a"})))
    assert shell.paused.proposal_digest is not None
    shell.invocation.grant_approval(shell.paused.proposal_digest, by="alice", at=AT)
    run = shell.resume()
    assert isinstance(run, RunCalls)
    shell.ran(ok(run.calls[0]))
    shell.answer(calls(("c1", "delete", {"path": "a"})))  # streak 2 of 2: waits for approval
    assert shell.paused.proposal_digest is not None
    shell.invocation.change_settings(Budget(max_repeated_plan=1), RunSettings(), at=AT, by="ops")
    shell.invocation.grant_approval(shell.paused.proposal_digest, by="alice", at=AT)

    action = shell.resume()

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.NO_PROGRESS


def test_a_resumed_batch_does_not_run_the_calls_that_were_denied() -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer(to_search_and_delete())
    assert shell.paused.proposal_digest is not None
    shell.invocation.deny_approval(
        shell.paused.proposal_digest, by="bob", reason="too risky", at=AT
    )
    shell.resume()
    shell.expect(RunCalls)  # the dispatch is committed; the process dies here
    resumed = Shell.over(replayed_invocation(shell.committed))

    action = resumed.begin()

    assert isinstance(action, RunCalls)
    assert [c.call_id for c in action.calls] == ["c1"]


def test_calls_the_policy_refuses_get_denied_results_and_do_not_run() -> None:
    shell = Shell.over(authorises=True)
    shell.begin()
    authorise = shell.answer(calls(("c1", "search", {"q": "x"}), ("c2", "search", {"q": "y"})))
    assert isinstance(authorise, Authorise)

    run = shell.feed(PolicyVerdict(refused={"c2": "refused by policy: not your tenant"}))

    assert isinstance(run, RunCalls)
    assert [c.call_id for c in run.calls] == ["c1"]
    shell.ran(ok(run.calls[0]))
    denied = shell.of_type(ResultsCommitted)[0].results[1]
    assert denied.error is not None
    assert denied.error.error_class is ErrorClass.DENIED
    assert denied.error.message == "refused by policy: not your tenant"


# --------------------------------------------------------------------------- cancel, deadline


def test_a_cancel_request_before_asking_ends_cancelled_with_its_detail() -> None:
    shell = Shell.over()
    shell.now = Moment(at=AT, elapsed_s=0.0, cancel_requested=True, cancel_detail="ops: stop")

    action = shell.begin()

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.CANCELLED
    assert shell.terminated.detail == "cancel requested: ops: stop"
    assert shell.of_type(DecisionProposed) == []


def test_a_cancel_that_interrupts_the_model_ends_cancelled() -> None:
    shell = Shell.over()
    shell.begin()

    action = shell.feed(ModelInterrupted())

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.CANCELLED
    assert shell.terminated.detail == "cancel requested"
    assert shell.of_type(DecisionProposed) == []


def test_a_cancel_request_before_dispatch_records_the_decision_and_dispatches_nothing() -> None:
    shell = Shell.over()
    shell.begin()
    shell.now = Moment(at=AT, elapsed_s=1.0, cancel_requested=True, cancel_detail="ops: stop")

    action = shell.answer(calls(("c1", "search", {"q": "x"})))

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.CANCELLED
    assert shell.terminated.detail == "cancel requested: ops: stop"
    assert types(shell.committed) == ["InvocationStarted", "DecisionProposed", "Terminated"]


def test_a_cancel_during_a_batch_commits_every_result_then_ends_cancelled() -> None:
    shell = Shell.over()
    shell.begin()
    run = shell.answer(to_write_and_read())
    assert isinstance(run, RunCalls)
    shell.now = Moment(at=AT, elapsed_s=1.0, cancel_requested=True, cancel_detail="ops: stop")

    action = shell.ran(ok(run.calls[0]), interruption=Interruption.CANCELLED)

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.CANCELLED
    assert shell.terminated.detail == "cancel requested while tools ran: ops: stop"
    read, write = shell.of_type(ResultsCommitted)[0].results
    assert read.ok
    assert write.error is not None
    assert write.error.error_class is ErrorClass.OUTCOME_UNKNOWN
    assert write.effect_status is EffectStatus.OUTCOME_UNKNOWN
    # Nobody knows whether the write reached its service: it stays open in the ledger.
    assert types(shell.effect_events(key_of(run, "c2"))) == ["EffectPrepared", "EffectDispatched"]
    assert types(shell.committed)[-2:] == ["ResultsCommitted", "Terminated"]


def test_the_deadline_ends_the_run_before_the_model_is_asked() -> None:
    shell = Shell.over(budget=Budget(deadline_s=10.0))
    shell.now = Moment(at=AT, elapsed_s=10.0)

    action = shell.begin()

    assert action == Finished()
    assert shell.core.seconds_left(shell.now) == 0.0
    assert shell.terminated.reason is TerminalReason.DEADLINE_EXCEEDED
    assert shell.of_type(DecisionProposed) == []


def test_the_model_is_asked_while_the_deadline_has_not_passed() -> None:
    shell = Shell.over(budget=Budget(deadline_s=10.0))
    shell.now = Moment(at=AT, elapsed_s=9.5)

    assert isinstance(shell.begin(), AskModel)
    assert shell.core.seconds_left(shell.now) == 0.5


def test_a_model_that_does_not_answer_in_time_ends_deadline_exceeded() -> None:
    shell = Shell.over(budget=Budget(deadline_s=10.0))
    shell.begin()

    action = shell.feed(ModelTimedOut())

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.DEADLINE_EXCEEDED
    assert shell.terminated.detail == "the model did not answer in time"


def test_a_deadline_that_interrupts_a_batch_commits_its_results_then_ends() -> None:
    shell = Shell.over(budget=Budget(deadline_s=10.0))
    shell.begin()
    run = shell.answer(calls(("c1", "search", {"q": "x"})))
    assert isinstance(run, RunCalls)

    action = shell.ran(
        interrupted_result(run.calls[0], Interruption.DEADLINE, started=True),
        interruption=Interruption.DEADLINE,
    )

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.DEADLINE_EXCEEDED
    assert shell.terminated.detail == "the deadline passed while tools ran"
    result = shell.of_type(ResultsCommitted)[0].results[0]
    assert result.error is not None
    assert result.error.error_class is ErrorClass.DEADLINE_EXCEEDED


# --------------------------------------------------------------------------- budgets


def test_max_steps_ends_the_run_before_the_next_model_call() -> None:
    shell = Shell.over(budget=Budget(max_steps=1))
    shell.begin()
    run = shell.answer(calls(("c1", "search", {"q": "x"})))
    assert isinstance(run, RunCalls)

    action = shell.ran(ok(run.calls[0]))

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.MAX_STEPS
    assert shell.terminated.detail == "1 steps taken"
    assert shell.terminated.steps == 1


def test_the_model_is_told_when_it_reaches_its_last_steps() -> None:
    shell = Shell.over(budget=Budget(max_steps=3, wind_down_steps=2))
    assert shell.begin() == AskModel(step=1, turns=[], notices=[])
    run = shell.answer(calls(("c1", "search", {"q": "x"})))
    assert isinstance(run, RunCalls)

    ask = shell.ran(ok(run.calls[0]))

    assert isinstance(ask, AskModel)
    assert ask.notices == ["2 step(s) left: summarise what you have and stop."]


def test_a_batch_past_the_tool_budget_ends_tool_budget_exhausted_without_dispatch() -> None:
    shell = Shell.over(budget=Budget(max_tool_calls=1))
    shell.begin()

    action = shell.answer(calls(("c1", "search", {"q": "x"}), ("c2", "search", {"q": "y"})))

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.TOOL_BUDGET_EXHAUSTED
    assert shell.terminated.detail == "2 call(s) proposed, 0 of 1 used"
    assert shell.of_type(BatchDispatched) == []


def test_the_token_reservation_stops_the_run_before_a_call_that_could_pass_the_budget() -> None:
    shell = Shell.over(budget=Budget(max_tokens=100, reserve_tokens=50))
    shell.begin()
    run = shell.answer(
        calls(("c1", "search", {"q": "x"})), Usage(input_tokens=40, output_tokens=20)
    )
    assert isinstance(run, RunCalls)

    action = shell.ran(ok(run.calls[0]))

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.TOKEN_BUDGET_EXHAUSTED
    assert shell.terminated.detail == "60 of 100 tokens used, 50 reserved for the next call"
    assert len(shell.of_type(DecisionProposed)) == 1


def test_a_reply_that_overruns_the_token_budget_is_recorded_and_not_acted_on() -> None:
    shell = Shell.over(budget=Budget(max_tokens=100))
    shell.begin()

    action = shell.answer(
        calls(("c1", "search", {"q": "x"})), Usage(input_tokens=80, output_tokens=40)
    )

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.TOKEN_BUDGET_EXHAUSTED
    assert shell.terminated.detail == "120 of 100 tokens used"
    assert proposed(shell).usage.input_tokens == 80
    assert shell.of_type(BatchDispatched) == []


def test_the_price_turns_tokens_into_cost_when_the_model_reports_none() -> None:
    shell = Shell.over(settings=RunSettings(price=Price(input_per_million=2.0e6)))
    shell.begin()

    shell.answer(final("42"), Usage(input_tokens=3))

    assert proposed(shell).usage.cost == 6.0
    assert shell.invocation.cost == 6.0


def test_a_cost_the_model_reports_is_kept_as_it_is() -> None:
    shell = Shell.over(settings=RunSettings(price=Price(input_per_million=2.0e6)))
    shell.begin()

    shell.answer(final("42"), Usage(input_tokens=3, cost=0.25))

    assert proposed(shell).usage.cost == 0.25


def test_the_cost_reservation_stops_the_run_before_a_call_that_could_pass_the_budget() -> None:
    shell = Shell.over(
        budget=Budget(max_cost=5.0, reserve_cost=2.5),
        settings=RunSettings(price=Price(input_per_million=1.0e6)),
    )
    shell.begin()
    run = shell.answer(calls(("c1", "search", {"q": "x"})), Usage(input_tokens=3))
    assert isinstance(run, RunCalls)

    action = shell.ran(ok(run.calls[0]))

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.COST_BUDGET_EXHAUSTED
    assert shell.terminated.detail == (
        "3.000000 of 5.000000 spent, 2.500000 reserved for the next call"
    )


def test_a_reply_that_overruns_the_cost_budget_is_recorded_and_not_acted_on() -> None:
    shell = Shell.over(
        budget=Budget(max_cost=1.0), settings=RunSettings(price=Price(output_per_million=1.0e6))
    )
    shell.begin()

    action = shell.answer(calls(("c1", "search", {"q": "x"})), Usage(output_tokens=2))

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.COST_BUDGET_EXHAUSTED
    assert shell.terminated.detail == "2.000000 of 1.000000 spent"
    assert shell.of_type(BatchDispatched) == []


def test_a_long_history_is_compacted_in_the_models_view_and_the_compaction_is_recorded() -> None:
    shell = Shell.over(settings=RunSettings(context_limit=10, keep_recent_turns=1))
    shell.begin()
    for query in ("q1", "q2", "q3"):
        run = shell.answer(calls(("c1", "search", {"q": query})))
        assert isinstance(run, RunCalls)
        ask = shell.ran(ok(run.calls[0]))

    assert isinstance(ask, AskModel)
    assert [turn.step for turn in ask.turns] == [1, 3]
    assert ask.notices[0].startswith("1 earlier step(s) left out to fit the context (steps 2)")
    shell.answer(final("42"))
    [compacted] = shell.of_type(ContextCompacted)
    assert (compacted.step, compacted.dropped_steps, compacted.kept_steps) == (4, [2], [1, 3])


# --------------------------------------------------------------------------- repetition


def search_once_then(shell: Shell, first: dict[str, Any]) -> None:
    shell.begin()
    run = shell.answer(calls(("c1", "search", first)))
    assert isinstance(run, RunCalls)
    ask = shell.ran(ok(run.calls[0]))
    assert isinstance(ask, AskModel)


def test_the_same_plan_again_ends_no_progress_before_it_runs() -> None:
    shell = Shell.over(budget=Budget(max_repeated_plan=1))
    search_once_then(shell, {"q": "x", "limit": 3})

    action = shell.answer(calls(("other-id", "search", {"q": "x", "limit": 3})))

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.NO_PROGRESS
    assert shell.terminated.detail == "the same plan was proposed 2 times in a row"
    assert len(shell.of_type(BatchDispatched)) == 1


def test_a_plan_that_only_spells_out_a_default_is_the_same_plan() -> None:
    """The fingerprint is over normalised arguments: ``limit`` defaults to 10."""
    shell = Shell.over(budget=Budget(max_repeated_plan=1))
    search_once_then(shell, {"q": "x"})

    action = shell.answer(calls(("c1", "search", {"q": "x", "limit": 10})))

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.NO_PROGRESS
    assert len(shell.of_type(BatchDispatched)) == 1


def test_a_plan_that_leaves_out_a_default_it_spelt_out_before_is_the_same_plan() -> None:
    shell = Shell.over(budget=Budget(max_repeated_plan=1))
    search_once_then(shell, {"q": "x", "limit": 10})

    shell.answer(calls(("c1", "search", {"q": "x"})))

    assert shell.terminated.reason is TerminalReason.NO_PROGRESS


def test_a_plan_with_another_value_than_the_default_is_a_new_plan() -> None:
    shell = Shell.over(budget=Budget(max_repeated_plan=1))
    search_once_then(shell, {"q": "x"})

    assert isinstance(shell.answer(calls(("c1", "search", {"q": "x", "limit": 5}))), RunCalls)


def fail_search(shell: Shell) -> Action:
    run = shell.answer(calls(("c1", "search", {"q": "x"})))
    assert isinstance(run, RunCalls)
    return shell.ran(failed(run.calls[0]))


def test_the_same_failure_max_repeated_failures_times_ends_repeated_failure() -> None:
    shell = Shell.over(
        budget=Budget(max_repeated_plan=5), settings=RunSettings(max_repeated_failures=2)
    )
    shell.begin()
    assert isinstance(fail_search(shell), AskModel)

    action = fail_search(shell)

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.REPEATED_FAILURE
    assert shell.terminated.detail == "the same call failed the same way 2 times in a row"
    # The results and the stop are one commit.
    assert types(shell.committed)[-2:] == ["ResultsCommitted", "Terminated"]


def test_a_tools_own_failure_limit_overrides_max_repeated_failures() -> None:
    shell = Shell.over(
        budget=Budget(max_repeated_plan=5),
        settings=RunSettings(max_repeated_failures=3, tool_failure_limits={"search": 1}),
    )
    shell.begin()

    action = fail_search(shell)

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.REPEATED_FAILURE
    assert shell.terminated.detail == "the same call failed the same way 1 times in a row"


# --------------------------------------------------------------------------- invalid decisions


@pytest.mark.parametrize(
    ("proposal", "rejection_class", "problem"),
    [
        pytest.param(
            {"kind": "guess", "answer": "42"}, RejectionClass.SCHEMA_INVALID, "decision", id="kind"
        ),
        pytest.param("the answer is 42", RejectionClass.SCHEMA_INVALID, "", id="plain-text"),
        pytest.param(
            final("   "),
            RejectionClass.EMPTY_ANSWER,
            "the final answer is empty",
            id="empty-answer",
        ),
        pytest.param(calls(), RejectionClass.EMPTY_BATCH, "the tool batch is empty", id="no-calls"),
        pytest.param(
            calls(("c1", "search", {"q": "x"}), ("c1", "search", {"q": "y"})),
            RejectionClass.DUPLICATE_CALL_ID,
            "duplicate call id 'c1'",
            id="duplicate-ids",
        ),
        pytest.param(
            calls(("c1", "rm", {"path": "/"})),
            RejectionClass.UNKNOWN_TOOL,
            "call c1: unknown tool 'rm'",
            id="unknown-tool",
        ),
        pytest.param(
            calls(("c1", "search", {"q": "x", "limit": "many"})),
            RejectionClass.INVALID_ARGUMENTS,
            "call c1: arguments for search are invalid: limit:",
            id="wrong-type",
        ),
        pytest.param(
            calls(("c1", "search", {})),
            RejectionClass.INVALID_ARGUMENTS,
            "call c1: arguments for search are invalid: q: Field required",
            id="missing-argument",
        ),
        pytest.param(
            calls(("c1", "search", {"q": "x", "colour": "red"})),
            RejectionClass.INVALID_ARGUMENTS,
            "colour: Extra inputs are not permitted",
            id="unexpected-argument",
        ),
    ],
)
def test_an_invalid_proposal_is_recorded_as_a_rejection_and_ends_invalid_decision(
    proposal: Any, rejection_class: RejectionClass, problem: str
) -> None:
    """With ``max_invalid_proposals=0`` the first invalid proposal ends the run."""
    shell = Shell.over(settings=RunSettings(max_invalid_proposals=0))
    shell.begin()

    action = shell.answer(proposal)

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.INVALID_DECISION
    assert shell.terminated.detail is not None
    assert problem in shell.terminated.detail
    rejection = proposed(shell).rejection
    assert rejection is not None
    assert rejection.rejection_class is rejection_class
    assert proposed(shell).decision is None
    assert shell.of_type(BatchDispatched) == []


def test_an_invalid_proposal_is_committed_and_the_model_asked_again_with_its_problems() -> None:
    shell = Shell.over()  # the default: two invalid proposals in a row go back
    shell.begin()

    action = shell.answer({"kind": "tool_calls", "calls": []})

    assert isinstance(action, AskModel)
    assert action.step == 2
    rejection = action.turns[-1].rejection
    assert rejection is not None
    assert rejection.problems == ["the tool batch is empty"]
    assert shell.invocation.invalid_streak == 1


def test_one_invalid_proposal_more_than_max_invalid_proposals_ends_invalid_decision() -> None:
    shell = Shell.over(settings=RunSettings(max_invalid_proposals=1))
    shell.begin()

    assert isinstance(shell.answer({"kind": "final", "answer": " "}), AskModel)
    action = shell.answer({"kind": "final", "answer": ""})

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.INVALID_DECISION
    assert shell.terminated.detail == "the final answer is empty"


def test_a_policy_that_stops_the_run_ends_invalid_decision() -> None:
    shell = Shell.over(authorises=True)
    shell.begin()
    authorise = shell.answer(calls(("c1", "search", {"q": "x"})))
    assert isinstance(authorise, Authorise)
    assert [c.arguments for c in authorise.calls] == [{"q": "x", "limit": 10}]

    action = shell.feed(PolicyVerdict(stop="call c1: the actor may not read"))

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.INVALID_DECISION
    assert shell.terminated.detail == "refused by policy: call c1: the actor may not read"
    assert shell.of_type(BatchDispatched) == []


def test_a_model_that_fails_ends_model_error() -> None:
    shell = Shell.over()
    shell.begin()

    action = shell.feed(ModelFailed(error_type="RateLimitError", message="slow down"))

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.MODEL_ERROR
    assert shell.terminated.detail == "RateLimitError: slow down"
    assert shell.of_type(DecisionProposed) == []


# --------------------------------------------------------------------------- writes


def run_unknown_write(shell: Shell) -> tuple[RunCalls, Reconcile]:
    shell.begin()
    run = shell.answer(calls(("c1", "send", {"to": "bob"})))
    assert isinstance(run, RunCalls)
    reconcile = shell.ran(unknown(run.calls[0]))
    assert isinstance(reconcile, Reconcile)
    return run, reconcile


def test_a_write_is_dispatched_with_a_ledger_entry_committed_before_it_runs() -> None:
    shell = Shell.over()
    shell.begin()

    run = shell.answer(calls(("c1", "send", {"to": "bob"})))

    assert isinstance(run, RunCalls)
    assert run.first_dispatch
    assert run.attempts == {"c1": 1}
    assert types(shell.committed) == [
        "InvocationStarted",
        "DecisionProposed",
        "BatchDispatched",
        "EffectPrepared",
        "EffectDispatched",
    ]
    assert shell.of_type(BatchDispatched)[0].calls[0].effect_key == key_of(run, "c1")


def test_an_unknown_write_whose_service_cannot_be_asked_pauses_for_reconciliation() -> None:
    shell = Shell.over()
    run, reconcile = run_unknown_write(shell)
    key = key_of(run, "c1")
    assert reconcile == Reconcile(effects=[(key, "send")])

    action = shell.feed(Answers({key: ServiceUnreachable(effect_key=key, error="no route")}))

    assert action == Finished()
    assert shell.invocation.phase is Phase.AWAITING_RECONCILIATION
    assert shell.paused.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert shell.paused.question == (
        f"the outcome of a write is unknown and its service cannot be asked: {key} (send): no route"
    )
    assert shell.invocation.pending_batch is not None
    assert shell.of_type(ResultsCommitted) == []
    assert types(shell.effect_events(key))[-1] == "EffectOutcomeUnknown"


def test_a_write_whose_earlier_attempt_still_runs_is_not_sent_again_but_paused() -> None:
    """A "not found" proves nothing while an abandoned attempt may still reach the service."""
    shell = Shell.over()
    run, _ = run_unknown_write(shell)
    key = key_of(run, "c1")

    action = shell.feed(Answers({key: AttemptStillRunning(effect_key=key, waited_s=2.0)}))

    assert action == Finished()
    assert shell.invocation.phase is Phase.AWAITING_RECONCILIATION
    assert shell.paused.question == (
        "the outcome of a write is unknown and an earlier attempt may still be running: "
        f"{key} (send): attempt 1 was still running after 2 s more; it is not sent again "
        "while it may still reach its service"
    )
    assert "EffectDispatched" not in types(shell.effect_events(key))[2:]


def test_a_resumed_reconciliation_that_still_cannot_ask_stays_paused_without_a_second_pause() -> (
    None
):
    shell = Shell.over()
    run, _ = run_unknown_write(shell)
    key = key_of(run, "c1")
    shell.feed(Answers({key: ServiceUnreachable(effect_key=key, error="no route")}))
    resumed = Shell.over(replayed_invocation(shell.committed))
    assert resumed.begin() == LoadEffects(keys=[key])
    assert resumed.feed(Loaded({key: replayed_effect(shell.committed, key)})) == Reconcile(
        effects=[(key, "send")]
    )

    action = resumed.feed(Answers({key: ServiceUnreachable(effect_key=key, error="still down")}))

    assert isinstance(action, Finished)
    assert action.detail is not None
    assert "still down" in action.detail
    assert resumed.committed == []
    assert resumed.invocation.phase is Phase.AWAITING_RECONCILIATION


def test_a_not_found_answer_dispatches_the_write_again_with_the_same_key() -> None:
    shell = Shell.over()
    run, _ = run_unknown_write(shell)
    key = key_of(run, "c1")

    again = shell.feed(Answers({key: EffectAnswered(effect_key=key, status=Resolution.NOT_FOUND)}))

    assert isinstance(again, RunCalls)
    assert not again.first_dispatch
    assert again.attempts == {"c1": 2}
    assert key_of(again, "c1") == key
    # The answer and the new dispatch are committed before the write runs again.
    assert isinstance(shell.committed[-2], EffectReconciled)
    dispatched = shell.committed[-1]
    assert isinstance(dispatched, EffectDispatched)
    assert dispatched.attempt == 2


def test_a_write_whose_service_keeps_not_finding_it_pauses_after_max_dispatch_rounds() -> None:
    shell = Shell.over()
    run, _ = run_unknown_write(shell)
    key = key_of(run, "c1")
    attempts = [run.attempts["c1"]]
    action: Action = shell.action or run
    for _ in range(MAX_DISPATCH_ROUNDS):
        action = shell.feed(
            Answers({key: EffectAnswered(effect_key=key, status=Resolution.NOT_FOUND)})
        )
        if not isinstance(action, RunCalls):
            break
        attempts.append(action.attempts["c1"])
        assert isinstance(shell.ran(unknown(action.calls[0])), Reconcile)

    assert attempts == list(range(1, MAX_DISPATCH_ROUNDS + 1))
    assert action == Finished()
    assert shell.invocation.phase is Phase.AWAITING_RECONCILIATION
    assert shell.paused.question == (
        f"a write was dispatched {MAX_DISPATCH_ROUNDS} times and its service still "
        "does not know its key"
    )
    assert len([e for e in shell.effect_events(key) if isinstance(e, EffectDispatched)]) == (
        MAX_DISPATCH_ROUNDS
    )


def test_a_cancel_request_while_a_write_is_settled_does_not_dispatch_it_again() -> None:
    shell = Shell.over()
    run, _ = run_unknown_write(shell)
    key = key_of(run, "c1")
    shell.now = Moment(at=AT, elapsed_s=1.0, cancel_requested=True, cancel_detail="ops: stop")

    action = shell.feed(Answers({key: EffectAnswered(effect_key=key, status=Resolution.NOT_FOUND)}))

    assert action == Finished()
    assert shell.terminated.reason is TerminalReason.CANCELLED
    assert shell.terminated.detail == "cancel requested while a write was being settled: ops: stop"
    result = shell.of_type(ResultsCommitted)[0].results[0]
    assert result.error is not None
    assert result.error.error_class is ErrorClass.REJECTED
    assert result.effect_status is EffectStatus.PREPARED
    assert len([e for e in shell.effect_events(key) if isinstance(e, EffectDispatched)]) == 1


def test_a_committed_answer_becomes_the_writes_result() -> None:
    shell = Shell.over()
    run, _ = run_unknown_write(shell)
    key = key_of(run, "c1")

    action = shell.feed(
        Answers(
            {key: EffectAnswered(effect_key=key, status=Resolution.COMMITTED, receipt={"id": 7})}
        )
    )

    assert isinstance(action, AskModel)
    result = shell.of_type(ResultsCommitted)[0].results[0]
    assert result.output == {"id": 7}
    assert result.effect_status is EffectStatus.RECONCILED
    assert result.effect_key == key


def test_a_reconciled_receipt_is_stored_as_the_tool_redacts_its_output() -> None:
    """A receipt from the service is the write's output: its sensitive fields are redacted."""
    secretive = {
        **TOOLS,
        "send": FakeTool(ToolEffect.WRITE, SendArguments, sensitive_output=frozenset({"token"})),
    }
    shell = Shell.over(catalogue=FakeCatalogue(secretive))
    run, _ = run_unknown_write(shell)
    key = key_of(run, "c1")
    receipt = {"id": 7, "token": "tok_live_1234"}

    shell.feed(
        Answers({key: EffectAnswered(effect_key=key, status=Resolution.COMMITTED, receipt=receipt)})
    )

    result = shell.of_type(ResultsCommitted)[0].results[0]
    assert result.output == {"id": 7, "token": REDACTED}
    assert "tok_live_1234" not in str([e.model_dump() for e in shell.committed])
    secrets = shell.core.take_secrets()
    assert [(s.call_id, s.kind, s.value) for s in secrets] == [("c1", "output", receipt)]


def test_a_rejected_answer_becomes_the_writes_error() -> None:
    shell = Shell.over()
    run, _ = run_unknown_write(shell)
    key = key_of(run, "c1")

    shell.feed(
        Answers(
            {key: EffectAnswered(effect_key=key, status=Resolution.REJECTED, reason="no such user")}
        )
    )

    result = shell.of_type(ResultsCommitted)[0].results[0]
    assert result.error is not None
    assert result.error.error_class is ErrorClass.REJECTED
    assert result.error.message == "no such user"
    assert result.effect_status is EffectStatus.RECONCILED


def test_a_write_that_committed_is_not_reconciled() -> None:
    shell = Shell.over()
    shell.begin()
    run = shell.answer(calls(("c1", "send", {"to": "bob"})))
    assert isinstance(run, RunCalls)

    action = shell.ran(ok(run.calls[0], {"id": 1}))

    assert isinstance(action, AskModel)
    assert not any(isinstance(a, Reconcile) for a in shell.actions)
    assert types(shell.effect_events(key_of(run, "c1")))[-1] == "EffectCommitted"


def test_a_resumed_batch_uses_a_known_receipt_and_runs_its_reads_again() -> None:
    shell = Shell.over()
    shell.begin()
    run = shell.answer(to_write_and_read())
    assert isinstance(run, RunCalls)
    key = key_of(run, "c2")
    # The process dies after the dispatch commit; the ledger learnt the write's receipt.
    effect = replayed_effect(shell.committed, key)
    effect.commit({"id": 7}, at=AT)
    effect.take_events()
    resumed = Shell.over(replayed_invocation(shell.committed))

    assert resumed.begin() == LoadEffects(keys=[key])
    rerun = resumed.feed(Loaded({key: effect}))

    assert isinstance(rerun, RunCalls)
    assert [c.call_id for c in rerun.calls] == ["c1"]
    assert not rerun.first_dispatch
    assert rerun.attempts == {}
    assert isinstance(resumed.ran(ok(rerun.calls[0])), AskModel)
    read, write = resumed.of_type(ResultsCommitted)[0].results
    assert read.ok
    assert write.output == {"id": 7}
    assert write.effect_status is EffectStatus.COMMITTED
    assert resumed.of_type(BatchDispatched) == []


def test_a_resumed_batch_reconciles_a_write_that_was_dispatched() -> None:
    shell = Shell.over()
    shell.begin()
    run = shell.answer(calls(("c1", "send", {"to": "bob"})))
    assert isinstance(run, RunCalls)
    key = key_of(run, "c1")
    resumed = Shell.over(replayed_invocation(shell.committed))
    resumed.begin()

    action = resumed.feed(Loaded({key: replayed_effect(shell.committed, key)}))

    assert action == Reconcile(effects=[(key, "send")])


# --------------------------------------------------------------------------- stops from outside


def test_a_conflicting_commit_is_lease_lost() -> None:
    assert stop_after_failed_commit(conflict=True, error="ConflictError: v3") == (
        TerminalReason.LEASE_LOST,
        "another worker appended to this invocation first (ConflictError: v3)",
    )


def test_another_failed_commit_is_checkpoint_failed_and_resume_continues() -> None:
    assert stop_after_failed_commit(conflict=False, error="OperationalError: disk full") == (
        TerminalReason.CHECKPOINT_FAILED,
        "OperationalError: disk full; nothing of this step was recorded: "
        "resume continues from the last commit",
    )


# A failed commit records nothing: the store stays at the last commit, and a resume
# (a new core over the invocation the store holds) goes on from there.


def test_after_a_failed_dispatch_commit_resume_asks_the_model_again_for_that_step() -> None:
    """Bad input: the commit of ``DecisionProposed`` + ``BatchDispatched`` never landed."""
    shell = Shell.over()
    shell.begin()
    stored = list(shell.committed)
    run = shell.answer(calls(("c1", "send", {"to": "bob"})))
    assert isinstance(run, RunCalls)  # its commit is the one that failed

    resumed = Shell.over(replayed_invocation(stored))

    assert resumed.begin() == AskModel(step=1, turns=[], notices=[])
    assert resumed.invocation.phase is Phase.READY


def test_after_a_failed_results_commit_resume_runs_the_reads_of_the_batch_again() -> None:
    """Bad input: the calls ran, but the commit of ``ResultsCommitted`` never landed."""
    shell = Shell.over()
    shell.begin()
    run = shell.answer(calls(("c1", "search", {"q": "x"})))
    assert isinstance(run, RunCalls)
    stored = list(shell.committed)
    shell.ran(ok(run.calls[0]))  # its commit is the one that failed

    resumed = Shell.over(replayed_invocation(stored))
    rerun = resumed.begin()

    assert isinstance(rerun, RunCalls)
    assert [c.call_id for c in rerun.calls] == ["c1"]
    assert not rerun.first_dispatch


def test_after_a_failed_final_commit_resume_asks_the_model_again() -> None:
    """Bad input: the commit of the final ``DecisionProposed`` + ``Terminated`` never landed."""
    shell = Shell.over()
    shell.begin()
    run = shell.answer(calls(("c1", "search", {"q": "x"})))
    assert isinstance(run, RunCalls)
    shell.ran(ok(run.calls[0]))
    stored = list(shell.committed)
    assert isinstance(shell.answer(final("x")), Finished)  # its commit is the one that failed

    resumed = Shell.over(replayed_invocation(stored))
    action = resumed.begin()

    assert isinstance(action, AskModel)
    assert action.step == 2
    assert resumed.invocation.terminated is None


def test_an_outside_cancellation_gives_a_running_batch_results_then_ends_cancelled() -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer(to_write_and_read())
    invocation = replayed_invocation(shell.committed)

    assert record_outside_cancellation(invocation, at=AT)

    results, ended = invocation.take_events()
    assert isinstance(results, ResultsCommitted)
    read, write = results.results
    assert read.error is not None
    assert read.error.error_class is ErrorClass.CANCELLED
    assert write.effect_status is EffectStatus.OUTCOME_UNKNOWN
    assert isinstance(ended, Terminated)
    assert ended.reason is TerminalReason.CANCELLED
    assert ended.detail == "the caller cancelled"


def test_an_outside_cancellation_leaves_a_paused_invocation_paused() -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer({"kind": "clarification", "question": "which x?"})
    invocation = replayed_invocation(shell.committed)

    assert not record_outside_cancellation(invocation, at=AT)
    assert invocation.phase is Phase.AWAITING_CLARIFICATION


def test_cancelling_an_invocation_paused_for_reconciliation_commits_results_then_ends() -> None:
    shell = Shell.over()
    run, _ = run_unknown_write(shell)
    key = key_of(run, "c1")
    shell.feed(Answers({key: ServiceUnreachable(effect_key=key, error="no route")}))
    invocation = replayed_invocation(shell.committed)

    cancel_paused(invocation, "cancelled by ops", at=AT)

    results, ended = invocation.take_events()
    assert isinstance(results, ResultsCommitted)
    assert results.results[0].effect_status is EffectStatus.OUTCOME_UNKNOWN
    assert isinstance(ended, Terminated)
    assert ended.reason is TerminalReason.CANCELLED
    assert ended.detail == "cancelled by ops"
    assert invocation.phase is Phase.TERMINATED


# --------------------------------------------------------------------------- secrets


def test_a_sensitive_argument_is_stored_redacted_and_kept_as_a_secret() -> None:
    shell = Shell.over()
    shell.begin()

    run = shell.answer(calls(("c1", "login", {"user": "ann", "password": "hunter2"})))

    assert isinstance(run, RunCalls)
    decision = proposed(shell).decision
    assert isinstance(decision, ToolCalls)
    assert decision.calls[0].arguments == {"user": "ann", "password": REDACTED}
    assert shell.of_type(BatchDispatched)[0].calls[0].arguments == {
        "user": "ann",
        "password": REDACTED,
        "limit": 10,
    }
    assert run.calls[0].arguments["password"] == REDACTED
    assert shell.core.take_secrets() == [
        KeptSecret(
            step=1,
            call_id="c1",
            kind="arguments",
            value={"user": "ann", "password": "hunter2", "limit": 10},
        )
    ]
    assert shell.core.take_secrets() == []
    assert "hunter2" not in repr(shell.committed)


def test_a_sensitive_argument_of_a_rejected_proposal_is_stored_redacted() -> None:
    shell = Shell.over(settings=RunSettings(max_invalid_proposals=0))
    shell.begin()

    shell.answer(calls(("c1", "login", {"user": 7, "password": "hunter2"})))

    assert shell.terminated.reason is TerminalReason.INVALID_DECISION
    rejection = proposed(shell).rejection
    assert rejection is not None
    raw = cast("dict[str, Any]", rejection.raw)
    assert raw["calls"][0]["arguments"] == {"user": 7, "password": REDACTED}
    assert "hunter2" not in repr(shell.committed)


def test_a_sensitive_output_is_stored_redacted_and_kept_as_a_secret() -> None:
    shell = Shell.over()
    shell.begin()
    run = shell.answer(calls(("c1", "mint", {"scope": "read"})))
    assert isinstance(run, RunCalls)
    assert shell.core.take_secrets() == []

    shell.ran(ok(run.calls[0], {"token": "tok-123", "scope": "read"}))

    result = shell.of_type(ResultsCommitted)[0].results[0]
    assert result.output == {"token": REDACTED, "scope": "read"}
    assert shell.core.take_secrets() == [
        KeptSecret(step=1, call_id="c1", kind="output", value={"token": "tok-123", "scope": "read"})
    ]
    assert "tok-123" not in repr(shell.committed)


# --------------------------------------------------------------------------- replay


def recorded_run() -> Shell:
    """A run with a write, a reconciliation and a refused answer, driven step by step."""
    shell = Shell.over(verifies=True)
    shell.begin()
    run = shell.answer(to_write_and_read(), Usage(input_tokens=10, output_tokens=5))
    assert isinstance(run, RunCalls)
    key = key_of(run, "c2")
    assert isinstance(shell.ran(ok(run.calls[0]), unknown(run.calls[1])), Reconcile)
    shell.feed(
        Answers(
            {key: EffectAnswered(effect_key=key, status=Resolution.COMMITTED, receipt={"id": 7})}
        )
    )
    assert isinstance(shell.answer(final("41")), Verify)
    shell.feed(Verdict("not 41"))
    assert isinstance(shell.answer(final("42")), Verify)
    assert shell.feed(Verdict(None)) == Finished(completed=True)
    return shell


def test_recorded_observations_alone_drive_a_fresh_core_to_the_same_events() -> None:
    recorded = recorded_run()

    again = Shell.over(verifies=True)
    action = again.run(recorded.fed)

    assert action == Finished(completed=True)
    assert [(type(e).__name__, e.model_dump(mode="json")) for e in again.committed] == [
        (type(e).__name__, e.model_dump(mode="json")) for e in recorded.committed
    ]
    assert again.actions == recorded.actions
    assert isinstance(recorded.committed[-1], Terminated)
    assert any(isinstance(e, EffectOutcomeUnknown) for e in again.committed)
