"""The agents that wrote ``tests/fixtures/store-0.2.0*.sql``: a desk, its sub-agent, its handoff.

It imports only the public API (``loop_actors``) and the agent module of the 0.1.0
fixtures (``tests.fixture_agents``: its refund desk, ``lookup_order`` and ``refund``,
and the scripts of its refunds, which never change either), so that ``loop-actors resume ID --agent
tests.fixture_agents_0_2_0:agent`` and ``replay --check`` keep working on those stores
whatever happens to the runtime's private modules. The agents' names, tools, schemas,
budgets, approval rules, handoffs and their model's identity are recorded in every
invocation of the fixtures (the model's identity and the tools' descriptions in each
decision's model-input digests): changing any of them makes resuming those
invocations a catalogue or settings change, and their replay a ``model_input_changed``.
Change nothing here but comments, and do not move this module.

Three agents, each playing its part of the fixture by its script chosen by the goal
(``GOALS``, ``AUDITS``, ``BILLING``):

- ``agent`` (``fixture-desk-2``): the desk. Its tools are ``lookup_order`` and
  ``refund`` (approval above 100 euros), ``remind`` (a write that sleeps until its time
  with ``ctx.sleep_until``) and ``audit_order`` (the ``auditor`` agent as a tool: each
  call a child invocation); it may hand a conversation off to ``billing``.
- ``auditor`` (``fixture-auditor``): looks an order up and says what it found.
- ``billing`` (``fixture-billing``): answers from what the desk told it.

Their model is :class:`DeskModel`, a scripted model of this module (so that its
identity, which the model-input digests record, names this module and no private one
of the runtime's), reporting the usage a provider's adapter would: provider, model,
finish reason, attempts and prompt-cache tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from loop_actors import (
    Agent,
    Budget,
    ChildOutcome,
    HandoffTo,
    ModelReply,
    ModelRequest,
    ScriptedModel,
    ToolContext,
    Usage,
    tool,
)
from tests.fixture_agents import (
    DESK_ENV,
    _calls,  # the 0.1.0 agent's helper: {"kind": "tool_calls", ...}
    lookup_order,
    refund,
)
from tests.fixture_agents import GOALS as GOALS_0_1_0

__all__ = ["AUDITS", "BILLING", "DESK_ENV", "GOALS", "agent", "auditor", "billing"]

REMIND_AT = "2099-01-01T09:00:00+00:00"
"""When the sleeping invocation's reminder is due: far enough that it never is by itself."""

SHOP_OPENS = "2099-01-02T08:00:00+00:00"
"""When the waiting invocation asked to go on (it was woken early by ``ops``)."""

USAGE = Usage(
    input_tokens=12,
    output_tokens=6,
    cost=0.002,
    attempts=1,
    provider="fixture",
    model="desk-model-1",
    response_model="desk-model-1-2026",
    finish_reason="stop",
    cache_read_input_tokens=8,
    cache_write_input_tokens=2,
)
"""What every answer of :class:`DeskModel` reports it cost."""

REMINDED: list[str] = []
"""Who ``remind`` reminded (past its sleep) in this process."""


class DeskModel:
    """A scripted model named ``desk-model-1``: its identity is this class's, in this module."""

    model = "desk-model-1"

    def __init__(self, script: Callable[[ModelRequest], dict[str, Any]]) -> None:
        self._scripted = ScriptedModel(script, usage=USAGE)

    async def decide(self, request: ModelRequest) -> ModelReply:
        """The script's decision for ``request``."""
        return await self._scripted.decide(request)


@tool(effect="write")
async def remind(who: str, at: str, context: ToolContext) -> dict[str, str]:
    """Remind someone at a time (an ISO time with a zone): the call sleeps until then."""
    await context.sleep_until(datetime.fromisoformat(at))
    REMINDED.append(who)
    return {"reminded": who, "at": at}


# --------------------------------------------------------------------------- the auditor


def _audit(request: ModelRequest) -> dict[str, Any]:
    """A lookup of the order its goal names, then what it found."""
    order = request.goal.rsplit(" ", 1)[-1]
    if request.step == 1:
        return _calls(("l1", "lookup_order", {"order_id": order}))
    found = request.results[-1].output
    assert isinstance(found, dict)
    return {"kind": "final", "answer": f"{order} is {found['status']}, total {found['total']}"}


AUDITS: dict[str, Callable[[ModelRequest], dict[str, Any]]] = {"check order A-1": _audit}
"""The goals the auditor is given by the desk, and its script for each."""


def _helper(name: str, scripts: dict[str, Callable[[ModelRequest], dict[str, Any]]]) -> Agent:
    """An agent of the desk's that looks orders up, its script chosen by the goal."""
    return Agent(
        name,
        DeskModel(lambda request: scripts[request.goal](request)),
        [lookup_order],
        Budget(max_steps=5, max_tool_calls=5),
        task_class="support",
    )


auditor = _helper("fixture-auditor", AUDITS)
"""The desk's sub-agent, offered to it as the tool ``audit_order``."""


# --------------------------------------------------------------------------- billing


def _bill(request: ModelRequest) -> dict[str, Any]:
    """An answer from what the desk told it (the handoff's summary)."""
    origin = request.handed_off_from
    told = origin.seed if origin is not None and origin.seed else "nothing"
    return {"kind": "final", "answer": f"billing will refund: {told}"}


BILLING: dict[str, Callable[[ModelRequest], dict[str, Any]]] = {"I want my money back": _bill}
"""The goals billing takes over, and its script for each."""

billing = _helper("fixture-billing", BILLING)
"""The agent the desk hands a refund request off to (told only the desk's summary)."""


# --------------------------------------------------------------------------- the desk


def _remind(request: ModelRequest) -> dict[str, Any]:
    """A reminder that sleeps until ``REMIND_AT``, then an answer."""
    if request.step == 1:
        return _calls(("m1", "remind", {"who": "ann", "at": REMIND_AT}))
    reminded = request.results[-1].output
    assert isinstance(reminded, dict)
    return {"kind": "final", "answer": f"reminded {reminded['reminded']}"}


def _wait_for_the_shop(request: ModelRequest) -> dict[str, Any]:
    """A ``wait`` until ``SHOP_OPENS``, then an answer that says how it woke."""
    if request.step == 1:
        return {"kind": "wait", "reason": "the shop opens on the 2nd", "until": SHOP_OPENS}
    told = request.turns[-1].reply or ""
    return {"kind": "final", "answer": "bought bread" + (" early" if "early" in told else "")}


def _audit_a1(request: ModelRequest) -> dict[str, Any]:
    """The auditor asked (a child invocation), then its answer passed on."""
    if request.step == 1:
        return _calls(("a1", "audit_order", {"goal": "check order A-1"}))
    outcome = ChildOutcome.read(request.results[-1].output)
    assert outcome is not None
    return {"kind": "final", "answer": f"the auditor says: {outcome.answer}"}


def _hand_to_billing(request: ModelRequest) -> dict[str, Any]:
    """A lookup, then the conversation handed to billing with a summary."""
    if request.step == 1:
        return _calls(("l1", "lookup_order", {"order_id": "A-1"}))
    return {
        "kind": "handoff",
        "to": "fixture-billing",
        "reason": "the customer wants a refund",
        "summary": "order A-1, delivered, 40 euros",
    }


GOALS: dict[str, Callable[[ModelRequest], dict[str, Any]]] = {
    # The 0.1.0 fixture's: a lookup, a refund of 40 and an answer; refunds of 250 and 60.
    **{goal: GOALS_0_1_0[goal] for goal in ("refund order A-1", "refund order A-2 in full")},
    "refund order A-3": GOALS_0_1_0["refund order A-3"],
    "remind ann on new year's day": _remind,
    "buy bread when the shop opens": _wait_for_the_shop,
    "have order A-1 audited": _audit_a1,
    "I want my money back": _hand_to_billing,
}
"""Each goal of the desk's invocations, and the script its model follows for it."""

agent = Agent(
    "fixture-desk-2",
    DeskModel(lambda request: GOALS[request.goal](request)),
    [
        lookup_order,
        refund,
        remind,
        auditor.as_tool(name="audit_order", description="Ask the auditor to check an order."),
    ],
    Budget(max_steps=20, max_tool_calls=30),
    task_class="support",
    handoffs=[HandoffTo(billing, history="summary")],
)
"""The fixture's desk: ``--agent tests.fixture_agents_0_2_0:agent``."""
