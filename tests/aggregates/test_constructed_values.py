"""Models built without validation (``model_construct``) are checked again by the core.

pydantic validates a model when its constructor builds it, not when ``model_construct``
or ``model_copy(update=...)`` does. The turn core takes a model's proposal and usage
from user code, so an instance of the right class is never trusted for its class.

Inputs tried, each as a model's proposal: ``Final`` with a float, ``None`` or no
answer, a ``kind`` of another decision, ``schema_version`` 7, an answer updated to an
int by ``model_copy``; ``ToolCalls`` with a string for ``calls``, and with a
constructed ``ToolCall`` (an int id, text arguments); ``CannotContinue`` with an int
reason; ``Clarification`` with no question; ``RequestApproval`` with an int digest.
As usage: a ``Usage`` subclass holding a string, an object that is not a ``Usage``
but has every figure. As a tool's ``ToolError``: a class that is not an
``ErrorClass``, a retry flag that is not a bool.

Each is checked twice: with warnings raised as errors (the tests' setting, under which
pydantic's serializer warning used to turn these into ``value_invalid`` by accident)
and as a user runs (warnings shown, not raised: these crashed the run).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from aggregates.decisions import (
    CannotContinue,
    Clarification,
    ErrorClass,
    Final,
    RejectionClass,
    RequestApproval,
    TerminalReason,
    ToolCall,
    ToolCalls,
    Usage,
)
from aggregates.invocation import DecisionProposed, InvocationEvent, Terminated
from aggregates.revalidation import MalformedValueError, revalidated, tool_error_fields
from aggregates.turn import AskModel
from tests.support.constructed import NOT_USAGES, constructed
from tests.support.turn_core import Shell

CONSTRUCTED: dict[str, tuple[Any, str]] = {
    "final-float-answer": (constructed(Final, answer=1.5), "final.answer:"),
    "final-none-answer": (constructed(Final, answer=None), "final.answer:"),
    "final-no-answer": (constructed(Final), "final.answer: Field required"),
    "final-kind-of-tool-calls": (
        constructed(Final, kind="tool_calls", answer="a"),
        "tool_calls.calls: Field required",
    ),
    "final-schema-version-7": (
        constructed(Final, schema_version=7, answer="a"),
        "final.schema_version:",
    ),
    "final-copied-with-int-answer": (
        Final(answer="a").model_copy(update={"answer": 2}),
        "final.answer:",
    ),
    "tool-calls-as-text": (constructed(ToolCalls, calls="x"), "tool_calls.calls:"),
    "tool-call-constructed": (
        ToolCalls(calls=[constructed(ToolCall, id=5, name="search", arguments="zz")]),
        "tool_calls.calls.0.id:",
    ),
    "cannot-continue-int-reason": (
        constructed(CannotContinue, reason=5),
        "cannot_continue.reason:",
    ),
    "clarification-no-question": (
        constructed(Clarification),
        "clarification.question: Field required",
    ),
    "approval-int-digest": (
        constructed(RequestApproval, proposal_digest=5),
        "request_approval.proposal_digest:",
    ),
}


def proposed(shell: Shell) -> list[DecisionProposed]:
    return [e for e in shell.committed if isinstance(e, DecisionProposed)]


def round_trips(events: list[Any]) -> None:
    """Every committed invocation event reads back from its JSON as it was written."""
    for event in events:
        if isinstance(event, InvocationEvent):
            text = event.model_dump_json(exclude_none=True)
            assert type(event).model_validate_json(text) == event


@pytest.mark.parametrize("name", list(CONSTRUCTED))
def test_a_constructed_decision_is_rejected_schema_invalid_and_the_model_asked_again(
    name: str, shown_warnings: list[warnings.WarningMessage]
) -> None:
    proposal, problem = CONSTRUCTED[name]
    shell = Shell.over()
    shell.begin()
    shell.answer(proposal)
    shell.expect(AskModel)  # recorded with its problems, which the model is shown
    shell.committed.extend(shell.core.take_events())
    (decision,) = proposed(shell)
    assert decision.decision is None
    assert decision.rejection is not None
    assert decision.rejection.rejection_class is RejectionClass.SCHEMA_INVALID
    assert any(p.startswith(problem) for p in decision.rejection.problems), (
        decision.rejection.problems
    )
    round_trips(shell.committed)
    assert not shown_warnings, [str(w.message) for w in shown_warnings]


def test_a_valid_decision_model_is_taken_as_the_equal_decision() -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer(Final(answer="42"))
    assert shell.terminated.reason is TerminalReason.COMPLETED
    (decision,) = proposed(shell)
    assert decision.decision == Final(answer="42")


def test_a_decision_subclass_is_taken_as_its_decision_without_its_own_fields() -> None:
    """A subclass with a field of its own still proposes the decision it extends."""

    class Sure(Final):
        confidence: float = 0.9

    shell = Shell.over()
    shell.begin()
    shell.answer(Sure(answer="42"))
    (decision,) = proposed(shell)
    assert type(decision.decision) is Final
    assert decision.decision == Final(answer="42")


@pytest.mark.parametrize("usage", NOT_USAGES)
def test_a_usage_that_is_not_a_usage_ends_the_run_model_error(usage: Any) -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer(Final(answer="42"), usage)
    terminated = shell.terminated
    assert terminated.reason is TerminalReason.MODEL_ERROR
    assert "not a Usage" in (terminated.detail or "")
    round_trips(shell.committed)


def test_a_usage_subclass_holding_text_ends_the_run_model_error() -> None:
    class Reported(Usage):
        provider: str = "p"

    shell = Shell.over()
    shell.begin()
    shell.answer(Final(answer="42"), constructed(Reported, input_tokens="many"))
    terminated = shell.terminated
    assert terminated.reason is TerminalReason.MODEL_ERROR
    assert "input_tokens" in (terminated.detail or "")
    assert not [e for e in shell.committed if isinstance(e, Terminated) and e.answer]


def test_a_valid_usage_subclass_is_recorded_as_a_usage() -> None:
    class Reported(Usage):
        provider: str = "p"

    shell = Shell.over()
    shell.begin()
    shell.answer(Final(answer="42"), Reported(input_tokens=3, output_tokens=4))
    (decision,) = proposed(shell)
    assert type(decision.usage) is Usage
    assert (decision.usage.input_tokens, decision.usage.output_tokens) == (3, 4)
    round_trips(shell.committed)


@pytest.mark.parametrize(
    ("error_class", "retryable", "problem"),
    [
        ("bogus", False, "error_class:"),
        (None, False, "error_class:"),
        (ErrorClass.TIMEOUT, "maybe", "retryable:"),
        (ErrorClass.TIMEOUT, [], "retryable:"),
    ],
)
def test_a_malformed_tool_error_is_described_not_raised(
    error_class: object, retryable: object, problem: str
) -> None:
    said = tool_error_fields(error_class, retryable)
    assert isinstance(said, str)
    assert said.startswith(problem)


def test_a_tool_error_given_as_values_is_read_as_the_runtime_s_types() -> None:
    assert tool_error_fields("timeout", 1) == (ErrorClass.TIMEOUT, True)
    assert tool_error_fields(ErrorClass.REJECTED, False) == (ErrorClass.REJECTED, False)


def test_revalidated_names_every_malformed_field_without_its_value() -> None:
    with pytest.raises(MalformedValueError) as raised:
        revalidated(Usage, constructed(Usage, input_tokens="secret-4111", cost=[1]))
    assert raised.value.problems[0].startswith("input_tokens:")
    assert raised.value.problems[1].startswith("cost:")
    assert "secret-4111" not in str(raised.value)
