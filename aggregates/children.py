"""Child invocations: their identity, their link to the parent, and the budget they get.

An agent offered as a tool (``Agent.as_tool``) or run from a tool's body
(``ToolContext.run_agent``) runs as a *child invocation*: an invocation of its own,
with its own history, audit chain and clean context, whose outcome is the call's
result in the parent. Starting it is a write in the parent's effect ledger: its id is
derived from that write's effect key (:func:`child_id_of`), so that a parent resumed
after a crash finds the child it started instead of starting a second one.

A child's budget is an allotment of what the parent has left (:func:`allot`),
recorded in the parent's stream (``BudgetReserved``) with the batch that starts it;
what the child did not use comes back once (``BudgetReturned``) with the batch's
results. Tokens and cost cannot be reserved exactly: a child checks its allotment
before each model call, and one call can pass it (the overshoot rule: at most one
model call's overshoot per child, charged to the parent, whose next check sees it).

The values and rules only: the runtime (``loop_actors``) starts and drives children.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import Field, ValidationError

from aggregates.decisions import Budget, Frozen, TerminalReason
from aggregates.digest import digest_of

MAX_DEPTH = 4
"""How deep a tree of invocations may grow: a root is at depth 0, its children at 1."""

MAX_FAN_OUT = 32
"""How many children one invocation may start (in all its batches)."""


class ParentEnd(StrEnum):
    """What becomes of a child that has not ended when its parent ends."""

    CANCEL = "cancel"
    """The child is cancelled, with a detail naming the parent (the default)."""
    LET_FINISH = "let_finish"
    """The child runs on to its own end; nobody reads its outcome."""
    DETACH = "detach"
    """The child runs on as if it were a root (its link to the parent is kept)."""


class ParentLink(Frozen):
    """Recorded in a child's ``InvocationStarted`` (``parent``): where it comes from."""

    parent_id: str
    root_id: str
    """The invocation at the top of the tree."""
    call_id: str
    """The parent's call that started it."""
    effect_key: str
    """That call's effect key in the parent's ledger (the child's id derives from it)."""
    key: str | None = None
    """For a child started by a tool's body: the key that tells its children apart."""
    depth: Annotated[int, Field(ge=1)]
    on_parent_end: ParentEnd = ParentEnd.CANCEL


def child_id_of(effect_key: str, key: str | None = None) -> str:
    """The id of the child started by the write ``effect_key`` (with ``key``, from code).

    The same write (and key) gives the same id on every attempt, after every restart
    and on every worker: a second start of the same child finds the first.
    """
    return "child-" + digest_of([effect_key, key])[:32]


class Spent(Frozen):
    """What an invocation used of its budget (its own, without its children's)."""

    steps: Annotated[int, Field(ge=0)] = 0
    tool_calls: Annotated[int, Field(ge=0)] = 0
    tokens: Annotated[int, Field(ge=0)] = 0
    cost: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0

    def plus(self, other: Spent) -> Spent:
        """The sum of two."""
        return Spent(
            steps=self.steps + other.steps,
            tool_calls=self.tool_calls + other.tool_calls,
            tokens=self.tokens + other.tokens,
            cost=self.cost + other.cost,
        )

    def minus(self, other: Spent) -> Spent:
        """What is left of this after ``other`` (never below zero)."""
        return Spent(
            steps=max(0, self.steps - other.steps),
            tool_calls=max(0, self.tool_calls - other.tool_calls),
            tokens=max(0, self.tokens - other.tokens),
            cost=max(0.0, self.cost - other.cost),
        )


NOTHING_SPENT = Spent()
"""Nothing used (shared: a ``Spent`` is frozen), for the hot path of a run without children."""


class Allotment(Frozen):
    """The share of the parent's budget reserved for one child (None: not limited)."""

    steps: Annotated[int, Field(ge=0)]
    tool_calls: Annotated[int, Field(ge=0)]
    tokens: Annotated[int, Field(ge=0)] | None = None
    cost: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    deadline_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None

    @property
    def reserved(self) -> Spent:
        """The allotment as an amount the parent holds back until the child returns it."""
        return Spent(
            steps=self.steps,
            tool_calls=self.tool_calls,
            tokens=self.tokens or 0,
            cost=self.cost or 0.0,
        )

    def bound(self, budget: Budget) -> Budget:
        """``budget`` (the child agent's own) within this allotment."""
        deadline = budget.deadline_s
        if self.deadline_s is not None:
            deadline = self.deadline_s if deadline is None else min(deadline, self.deadline_s)
        return budget.model_copy(
            update={
                "max_steps": max(1, min(budget.max_steps, self.steps)),
                "max_tool_calls": min(budget.max_tool_calls, self.tool_calls),
                "deadline_s": deadline,
                "max_tokens": _least(budget.max_tokens, self.tokens),
                "max_cost": _least(budget.max_cost, self.cost),
            }
        )


N = TypeVar("N", int, float)


def _least(mine: N | None, allotted: N | None) -> N | None:
    if allotted is None:
        return mine
    return allotted if mine is None else min(mine, allotted)


class Left(Frozen):
    """What a parent has left to share among the children of a batch."""

    steps: int
    tool_calls: int
    tokens: int | None = None
    cost: float | None = None
    deadline_s: float | None = None


def allot(left: Left, asked: list[Budget | None]) -> list[Allotment | None]:
    """Each child's allotment, in call order; None for a child the parent cannot afford.

    A child the tool gives a ``budget`` asks for that much (capped at what is left);
    the others share what is left equally: ``floor(left / children in the batch)``.
    A child gets at least one step, or nothing (its call is refused). The wall clock
    is not shared: each child gets what is left of the parent's deadline.
    """
    count = len(asked)
    steps_left, calls_left = left.steps, left.tool_calls
    tokens_left, cost_left = left.tokens, left.cost
    allotments: list[Allotment | None] = []
    for budget in asked:
        steps = min(budget.max_steps if budget else left.steps // count, steps_left)
        if steps < 1:
            allotments.append(None)
            continue
        calls = min(budget.max_tool_calls if budget else left.tool_calls // count, calls_left)
        tokens: int | None = None
        if tokens_left is not None:
            wanted = budget.max_tokens if budget and budget.max_tokens is not None else None
            tokens = min(wanted if wanted is not None else tokens_left // count, tokens_left)
            tokens_left -= tokens
        cost: float | None = None
        if cost_left is not None:
            wanted_cost = budget.max_cost if budget and budget.max_cost is not None else None
            share = wanted_cost if wanted_cost is not None else cost_left / count
            cost = min(share, cost_left)
            cost_left -= cost
        steps_left -= steps
        calls_left -= calls
        allotments.append(
            Allotment(
                steps=steps,
                tool_calls=calls,
                tokens=tokens,
                cost=cost,
                deadline_s=left.deadline_s,
            )
        )
    return allotments


class ChildOutcome(Frozen):
    """A child's outcome as its parent's call returns it (the call's output)."""

    child_id: str
    terminal_reason: TerminalReason
    answer: str | None = None
    detail: str | None = None
    spent: Spent = Spent()
    """What the child used, its own children's included (returned to the parent)."""

    @classmethod
    def read(cls, output: Any) -> ChildOutcome | None:
        """The outcome a stored call output holds, or None when it holds none (cut, odd)."""
        if not isinstance(output, Mapping):
            return None
        try:
            return cls.model_validate(output)
        except ValidationError:
            return None


def unspent_share(allotment: Allotment, outcome: ChildOutcome | None) -> tuple[Spent, Spent]:
    """(what the child used, what comes back to the parent) for a returned allotment.

    A child whose outcome cannot be read (its output cut to fit, or replaced by an
    error) is taken to have used its whole allotment: nothing comes back.
    """
    reserved = allotment.reserved
    if outcome is None:
        return reserved, Spent()
    return outcome.spent, reserved.minus(outcome.spent)


def parent_cancelled(parent_id: str, detail: str | None) -> str:
    """The detail a child cancelled with its parent ends with."""
    return f"its parent {parent_id} was cancelled" + (f" ({detail})" if detail else "")


def depth_problem(depth: int) -> str | None:
    """Why an invocation at ``depth`` may not start a child, or None when it may."""
    if depth + 1 > MAX_DEPTH:
        return (
            f"not started: a child here would be at depth {depth + 1}, past the limit of "
            f"{MAX_DEPTH} (a tree of invocations is at most {MAX_DEPTH} deep)"
        )
    return None


def fan_out_problem(started: int, asked: int) -> str | None:
    """Why ``asked`` more children may not start after ``started``, or None when they may."""
    if started + asked > MAX_FAN_OUT:
        return (
            f"not started: this invocation has started {started} children and one "
            f"invocation starts at most {MAX_FAN_OUT}"
        )
    return None


class ChildSpec(Frozen):
    """What a tool that starts a child declares: the child's budget and its edge policy."""

    budget: Budget | None = None
    """The child's share, as limits (None: an equal share of what the parent has left)."""
    on_parent_end: ParentEnd = ParentEnd.CANCEL
