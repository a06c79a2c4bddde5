"""What an agent's own code hands the runtime is checked again: settings, verdicts, errors.

Inputs tried:

* an agent's ``Budget`` built with ``model_construct``: ``max_steps=0`` (stored, then
  the start of every run of it was unreadable), ``max_steps="x"`` (a ``TypeError``
  mid-run), ``max_tool_calls=-1``; a ``Price`` with ``input_per_million="x"`` (a
  ``TypeError``) and ``-5.0`` (stored unreadable): a ``UsageError`` when the ``Agent``
  is made, nothing stored; the same for the ``budget`` of ``Agent.as_tool`` (a child's
  share of its parent's budget);
* a policy's ``Deny`` built with ``model_construct``: without a reason (an
  ``AttributeError`` ended the run), with an int reason, with ``stop="maybe"``: the
  call is refused (``denied``), as when a policy raises, and the run goes on;
* a tool's ``ToolError`` with ``error_class="bogus"``, ``error_class=None`` or
  ``retryable="maybe"`` (a ``ValidationError`` ended the run): a read's result is
  ``tool_failed``, saying the ToolError was malformed; a write's outcome is unknown
  (the tool did not say what happened), so it is reconciled, not run again.
"""

from __future__ import annotations

from typing import Any

import pytest

from aggregates.effect import effect_key
from loop_actors import (
    Agent,
    Budget,
    Deny,
    EffectStatus,
    ErrorClass,
    Price,
    Reconciled,
    ScriptedModel,
    TerminalReason,
    ToolError,
    UsageError,
    tool,
)
from tests.support.constructed import constructed
from tests.support.replies import FINAL, calls
from tests.support.runs import drive, results_of


@tool
def lookup(key: str) -> str:
    """Read a key."""
    return key


MALFORMED_SETTINGS: dict[str, tuple[str, Any, str]] = {
    "budget-0-steps": ("budget", constructed(Budget, max_steps=0), "max_steps"),
    "budget-text-steps": ("budget", constructed(Budget, max_steps="x"), "max_steps"),
    "budget-negative-calls": ("budget", constructed(Budget, max_tool_calls=-1), "max_tool_calls"),
    "price-text": ("price", constructed(Price, input_per_million="x"), "input_per_million"),
    "price-negative": ("price", constructed(Price, input_per_million=-5.0), "input_per_million"),
}


@pytest.mark.parametrize("name", list(MALFORMED_SETTINGS))
def test_an_agent_refuses_a_budget_or_price_built_without_validation(name: str) -> None:
    setting, value, field = MALFORMED_SETTINGS[name]
    kind = type(value).__name__
    with pytest.raises(UsageError, match=f"^agent a: {setting} is a malformed {kind}: {field}:"):
        Agent("a", ScriptedModel([FINAL]), **{setting: value})


def test_a_child_s_budget_built_without_validation_is_refused_by_as_tool() -> None:
    child = Agent("child", ScriptedModel([FINAL]))
    with pytest.raises(
        UsageError,
        match=r"^agent child: as_tool\(budget=...\) is a malformed Budget: max_steps:",
    ):
        child.as_tool(budget=constructed(Budget, max_steps=0))


def test_an_agent_keeps_a_validated_copy_of_a_valid_budget_and_price() -> None:
    budget, price = Budget(max_steps=3), Price(input_per_million=1.0)
    agent = Agent("a", ScriptedModel([FINAL]), budget=budget, price=price)
    assert (agent.budget, agent.price) == (budget, price)


@pytest.mark.parametrize(
    "verdict",
    [
        pytest.param(constructed(Deny), id="no-reason"),
        pytest.param(constructed(Deny, reason=5), id="int-reason"),
        pytest.param(constructed(Deny, reason="no", stop="maybe"), id="stop-maybe"),
    ],
)
async def test_a_policy_that_answers_a_constructed_deny_refuses_the_call(
    db_url: str, verdict: Deny
) -> None:
    agent = Agent(
        "a",
        ScriptedModel([calls(("c1", "lookup", {"key": "k"})), FINAL]),
        [lookup],
        policy=lambda request: verdict,
    )
    outcome, events = await drive(agent, db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = results_of(events)
    assert result.error is not None
    assert result.error.error_class is ErrorClass.DENIED
    assert "the policy answered a malformed Deny" in result.error.message


MALFORMED_TOOL_ERRORS: dict[str, dict[str, Any]] = {
    "bogus-class": {"error_class": "bogus"},
    "no-class": {"error_class": None},
    "maybe-retryable": {"retryable": "maybe"},
}


@pytest.mark.parametrize("name", list(MALFORMED_TOOL_ERRORS))
async def test_a_read_that_raises_a_malformed_tool_error_fails_tool_failed(
    db_url: str, name: str
) -> None:
    @tool
    def fetch(key: str) -> str:
        """Fail with a malformed ToolError."""
        raise ToolError("the index is down", **MALFORMED_TOOL_ERRORS[name])

    agent = Agent("a", ScriptedModel([calls(("c1", "fetch", {"key": "k"})), FINAL]), [fetch])
    outcome, events = await drive(agent, db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = results_of(events)
    assert result.error is not None
    assert result.error.error_class is ErrorClass.TOOL_FAILED
    assert result.error.retryable is False
    field = next(iter(MALFORMED_TOOL_ERRORS[name]))
    assert result.error.message.startswith(
        f"ToolError: the index is down (a malformed ToolError: {field}: "
    )


async def test_a_write_that_raises_a_malformed_tool_error_is_reconciled_not_run_again(
    db_url: str,
) -> None:
    writes: list[str] = []

    def reconcile(key: str) -> Reconciled:
        return Reconciled(status="committed", receipt={"paid": True})

    @tool(effect="write", reconcile=reconcile)
    def pay(amount: int) -> dict[str, bool]:
        """Pay, then fail with a ToolError whose class is none of the runtime's."""
        writes.append(f"paid {amount}")
        raise ToolError("gateway said 'maybe'", error_class="bogus")  # type: ignore[arg-type]

    agent = Agent("a", ScriptedModel([calls(("p1", "pay", {"amount": 5})), FINAL]), [pay])
    outcome, events = await drive(agent, db_url)
    assert outcome.reason is TerminalReason.COMPLETED
    assert writes == ["paid 5"]  # once: reconciled, not run again
    (result,) = results_of(events)
    assert result.effect_key == effect_key("inv", 1, "p1")
    assert result.effect_status is EffectStatus.RECONCILED
    assert result.output == {"paid": True}
