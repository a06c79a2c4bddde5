"""The Agent: a name, a model, tools, a budget and the settings recorded with each run."""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from aggregates.children import ChildSpec, ParentEnd
from aggregates.decisions import Budget, Price
from aggregates.handoffs import HandoffHistory
from aggregates.invocation import ToolSpec, Turn
from aggregates.planning import ApproveBy, Planning
from aggregates.revalidation import MalformedValueError, revalidated
from aggregates.settings import DEFAULT_WIND_DOWN_NOTICE, MIN_SIZE_LIMIT, RunSettings
from aggregates.values import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MAX_PROPOSAL_BYTES,
    describe_error,
    safe_text,
)
from loop_actors._errors import UsageError
from loop_actors._guard import in_child_task, is_cancellation
from loop_actors.agent.critic import Critic
from loop_actors.agent.model import Model
from loop_actors.agent.policy import Policy
from loop_actors.agent.tools import (
    DEFAULT_TOOL_TIMEOUT_S,
    Reconciled,
    Tool,
    Toolbox,
    ToolContext,
    child_runs,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

Verifier = Callable[[str, list[Turn]], Any]
"""``verifier(answer, turns)``: True (or None) passes; False or a text (the evidence) refuses.

Plain or async. An exception is a refusal with the exception as evidence.
"""


async def run_verifier(verifier: Verifier, answer: str, turns: list[Turn]) -> str | None:
    """Run the agent's verifier; None when it passed, else its evidence.

    Cancellation: a checkpoint when the verifier is async; re-raises ``trio.Cancelled``.
    """
    try:
        verdict = verifier(answer, turns)
        if inspect.isawaitable(verdict):
            verdict = await in_child_task(_awaited, verdict)
    except BaseException as error:  # a verifier that breaks (in any way) does not pass an answer
        if is_cancellation(error):
            raise
        return f"the verifier raised {describe_error(error)}"
    if verdict is True or verdict is None:
        return None
    if verdict is False:
        return "the answer did not pass verification"
    return safe_text(verdict)


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _checked(agent: str, setting: str, cls: type[M], value: object) -> M:
    """A setting that must be a ``cls``, validated again (one built with model_construct).

    Raises:
        UsageError: it is not a ``cls``, or not a valid one.
    """
    if not isinstance(value, cls):
        raise UsageError(f"agent {agent}: {setting} must be a {cls.__name__}")
    try:
        return revalidated(cls, value)
    except MalformedValueError as error:
        raise UsageError(f"agent {agent}: {setting} is {error}") from None


def _tool_list(agent: str, tools: object) -> list[Tool | Callable[..., Any]]:
    """The agent's tools as a list, or a UsageError saying what was given instead.

    Raises:
        UsageError: a single tool or function, a string, a mapping, something that
            is not iterable, or an item that is neither a tool nor callable.
    """
    if isinstance(tools, Tool) or (callable(tools) and not isinstance(tools, Iterable)):
        label = tools.name if isinstance(tools, Tool) else getattr(tools, "__name__", "f")
        raise UsageError(
            f"agent {agent}: tools must be a list of tools, got the single "
            f"{type(tools).__name__} {label!r}; write tools=[{label}]"
        )
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Iterable):
        raise UsageError(
            f"agent {agent}: tools must be a list of tools (made with @tool, or functions), "
            f"got a value of type {type(tools).__name__}"
        )
    items: list[Tool | Callable[..., Any]] = []
    for position, item in enumerate(tools):
        if not isinstance(item, Tool) and not callable(item):
            raise UsageError(
                f"agent {agent}: tools[{position}] is of type {type(item).__name__}, "
                "not a tool or a function"
            )
        items.append(item)
    return items


class CatalogueChangedError(UsageError):
    """Raised when resuming with tools that changed incompatibly (removed, or new schema)."""


class SettingsChangedError(UsageError):
    """Raised when resuming with an agent whose recorded-only rules changed (approval rules)."""


def check_catalogue(recorded: Sequence[ToolSpec], toolbox: Toolbox) -> None:
    """Refuse a tool catalogue that lost a recorded tool or changed its schema or effect.

    Raises:
        CatalogueChangedError: naming each incompatible change.
    """
    problems = []
    for spec in recorded:
        current = toolbox.tools.get(spec.name)
        if current is None:
            problems.append(f"tool {spec.name!r} was removed")
        elif current.schema_digest != spec.schema_digest:
            problems.append(f"tool {spec.name!r} changed its schema or effect")
    if problems:
        raise CatalogueChangedError(
            "the tool catalogue changed since the invocation started: "
            + "; ".join(problems)
            + " (allow_catalogue_change / --allow-catalogue-change resumes anyway)"
        )


def approval_rules(toolbox: Toolbox) -> dict[str, str]:
    """Which tools need approval, and by which rule (a function by its name)."""
    rules = {}
    for name in sorted(toolbox.tools):
        rule = toolbox.tools[name].requires_approval
        if isinstance(rule, bool):
            rules[name] = "always" if rule else "never"
        else:
            qualname = getattr(rule, "__qualname__", type(rule).__qualname__)
            rules[name] = f"rule {getattr(rule, '__module__', '?')}.{qualname}"
    return rules


class HandoffTo:
    """A handoff target of an agent, and what it is told of the source's work."""

    __slots__ = ("agent", "history")

    def __init__(self, agent: Agent, history: HandoffHistory | str = HandoffHistory.FULL) -> None:
        """``agent`` takes over; ``history`` says what it is told of the source's work.

        ``full``: the source's steps; ``summary``: the summary its model wrote; ``none``.

        Raises:
            UsageError: ``agent`` is not an Agent, or an unknown ``history``.
        """
        if not isinstance(agent, Agent):
            raise UsageError(f"a handoff target must be an Agent, got {type(agent).__name__}")
        try:
            self.history = HandoffHistory(history)
        except ValueError:
            choices = ", ".join(h.value for h in HandoffHistory)
            raise UsageError(
                f"a handoff's history must be one of {choices}, got {history!r}"
            ) from None
        self.agent = agent

    def __repr__(self) -> str:
        return f"HandoffTo({self.agent.name!r}, history={self.history.value!r})"


def _handoff_routes(name: str, handoffs: Iterable[object]) -> dict[str, HandoffTo]:
    if isinstance(handoffs, str | bytes | Mapping) or not isinstance(handoffs, Iterable):
        raise UsageError(f"agent {name}: handoffs must be a list of agents")
    routes: dict[str, HandoffTo] = {}
    for item in handoffs:
        route = item if isinstance(item, HandoffTo) else HandoffTo(item)  # type: ignore[arg-type]
        target = route.agent.name
        if target in routes:
            raise UsageError(f"agent {name}: two handoffs to agents named {target!r}")
        routes[target] = route
    return routes


DEFAULT_CHILD_TIMEOUT_S = 3600.0
"""How long a call of ``Agent.as_tool`` waits for its child when neither has a deadline."""

CHILD_TIMEOUT_MARGIN_S = 60.0
"""What a call of ``Agent.as_tool`` waits past its child's deadline (for its last commit)."""


class Agent:
    """An agent: a name, a model, its tools, its budget and its settings (all frozen)."""

    __slots__ = (
        "budget",
        "critic",
        "handoffs",
        "model",
        "name",
        "policy",
        "settings",
        "task_class",
        "toolbox",
        "verifier",
        "version",
    )

    def __init__(
        self,
        name: str,
        model: Model | str,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        budget: Budget | None = None,
        *,
        version: str = "1",
        tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        task_class: str | None = None,
        verifier: Verifier | None = None,
        max_verification_attempts: int = 2,
        max_repeated_failures: int = 3,
        max_invalid_proposals: int = 2,
        price: Price | None = None,
        wind_down_notice: str = DEFAULT_WIND_DOWN_NOTICE,
        policy: Policy | None = None,
        context_limit: int | None = None,
        keep_recent_turns: int = 4,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        max_proposal_bytes: int = DEFAULT_MAX_PROPOSAL_BYTES,
        handoffs: Iterable[Agent | HandoffTo] = (),
        planning: Planning | None = None,
        critic: Critic | None = None,
    ) -> None:
        """Describe an agent.

        Args:
            name: recorded with every invocation; used to group metrics.
            model: what proposes decisions (a :class:`ScriptedModel` or an adapter).
            tools: tools made with :func:`tool`, or plain functions.
            budget: limits for each invocation (defaults: :class:`Budget`).
            version: recorded with every invocation, to tell agent revisions apart.
            tool_timeout_s: per-call timeout for tools that do not set their own.
            task_class: default task class recorded with each invocation.
            verifier: ``verifier(answer, turns)`` checks a final answer: True
                passes; False or a text (the evidence) refuses, and the evidence
                goes back to the model. Only a passed answer is ``completed``.
            max_verification_attempts: refused answers before ``verification_failed``.
            max_repeated_failures: failures in a row of one tool with the same
                arguments and error class before ``repeated_failure`` (a tool may
                set its own).
            price: turns the model's token usage into cost when the model does not
                report a cost (for ``Budget.max_cost``).
            wind_down_notice: what the model is told when ``Budget.wind_down_steps``
                or fewer steps are left (``{steps_left}`` is filled in).
            policy: ``policy(AccessRequest)`` authorises each call before dispatch
                (actor, tenant, operation, object): True allows; False or
                ``Deny(reason)`` gives the call a ``denied`` result without running
                it; ``Deny(reason, stop=True)`` ends the run (``invalid_decision``).
            context_limit: the most JSON characters of history the model is given;
                above it older turns are left out (never the first, the last
                ``keep_recent_turns``, or one with an unsettled write), the model is
                told, and ``ContextCompacted`` records it.
            keep_recent_turns: turns always kept in view.
            max_invalid_proposals: invalid proposals in a row (schema errors,
                unknown tools, invalid arguments, empty answers) that are recorded and
                given back to the model with their problems; one more ends the run
                ``invalid_decision`` (0: the first one does).
            max_output_bytes: the largest tool output (or reconciled receipt) stored
                whole, in bytes of its JSON (default 1 MB); a larger one is stored, and
                shown to the model, as ``{"truncated": true, "size": N, "sha256": ...,
                "head": ...}`` (see docs/reference/limits.md).
            max_proposal_bytes: the largest model proposal accepted, in bytes of its
                JSON (default 256 KB); a larger one is rejected ``too_large`` (the model
                is told, as for any invalid proposal) and stored as its truncated stand-in.
            handoffs: the agents the model may hand the conversation to (an Agent, or
                ``HandoffTo(agent, history=...)``: what the target is told of this
                run's work, ``full`` by default); see docs/how-to/hand-off-to-another-agent.md.
            critic: a :class:`Critic` reviews each final answer (after the verifier):
                ``revise`` sends it back to the model with the critique, ``accept`` or
                its spent rounds let it stand; see docs/how-to/add-a-critic.md.
            planning: ``Planning(approve_by="person")`` makes each run plan before it
                writes: it starts read-only (only read tools are offered, a write is
                refused), its model's plan pauses ``plan_approval_required``, and once a
                person approves it exactly its writes run; any other write waits for
                approval (``approve_by="policy"``: the policy approves, only if it is
                set); see docs/how-to/plan-then-approve.md.

        The budget and the settings (``max_verification_attempts``,
        ``max_repeated_failures`` and each tool's own, ``max_invalid_proposals``,
        ``price``, ``context_limit``, ``keep_recent_turns``, ``wind_down_notice``,
        ``max_output_bytes``, ``max_proposal_bytes``, the approval rules) are
        recorded when an invocation starts, and a resume follows the record.

        Raises:
            UsageError: a malformed argument.
            ToolDefinitionError: a tool cannot be described to a model.
        """
        if not isinstance(name, str) or not name.strip():
            raise UsageError("an agent needs a non-empty name")
        if isinstance(model, str):
            # The providers' adapters, imported for a model named by a string only (issue 32).
            from loop_actors.agent.adapters import model_from_name  # noqa: PLC0415

            model = model_from_name(model)
        if not callable(getattr(model, "decide", None)):
            raise UsageError(f"agent {name}: model must have an async decide(request) method")
        if not (tool_timeout_s > 0 and math.isfinite(tool_timeout_s)):
            raise UsageError(f"agent {name}: tool_timeout_s must be a positive number")
        budget = _checked(name, "budget", Budget, budget if budget is not None else Budget())
        if verifier is not None and not callable(verifier):
            raise UsageError(f"agent {name}: verifier must be callable")
        if max_verification_attempts < 1 or max_repeated_failures < 1:
            raise UsageError(
                f"agent {name}: max_verification_attempts and max_repeated_failures must be >= 1"
            )
        if critic is not None and not isinstance(critic, Critic):
            raise UsageError(f"agent {name}: critic must be a Critic, got {type(critic).__name__}")
        if policy is not None and not callable(policy):
            raise UsageError(f"agent {name}: policy must be callable")
        if context_limit is not None and context_limit < 1:
            raise UsageError(f"agent {name}: context_limit must be positive")
        if not isinstance(max_invalid_proposals, int) or max_invalid_proposals < 0:
            raise UsageError(f"agent {name}: max_invalid_proposals must be >= 0")
        if keep_recent_turns < 0:
            raise UsageError(f"agent {name}: keep_recent_turns must be >= 0")
        if price is not None:
            price = _checked(name, "price", Price, price)
        for setting, limit in (
            ("max_output_bytes", max_output_bytes),
            ("max_proposal_bytes", max_proposal_bytes),
        ):
            if type(limit) is not int or limit < MIN_SIZE_LIMIT:
                raise UsageError(f"agent {name}: {setting} must be an integer >= {MIN_SIZE_LIMIT}")
        if planning is not None:
            planning = _checked(name, "planning", Planning, planning)
            if planning.approve_by is ApproveBy.POLICY and policy is None:
                raise UsageError(
                    f"agent {name}: planning approve_by='policy' needs a policy to approve plans"
                )
        toolbox = Toolbox(_tool_list(name, tools), default_timeout_s=tool_timeout_s)
        routes = _handoff_routes(name, handoffs)
        settings = RunSettings(
            max_invalid_proposals=max_invalid_proposals,
            max_verification_attempts=max_verification_attempts,
            max_repeated_failures=max_repeated_failures,
            tool_failure_limits={
                t.name: t.max_repeated_failures
                for t in toolbox.tools.values()
                if t.max_repeated_failures is not None
            },
            price=price,
            context_limit=context_limit,
            keep_recent_turns=keep_recent_turns,
            wind_down_notice=wind_down_notice,
            approval_rules=approval_rules(toolbox),
            max_output_bytes=max_output_bytes,
            max_proposal_bytes=max_proposal_bytes,
            handoffs={n: route.history.value for n, route in routes.items()} or None,
            planning=planning,
            critic=critic.settings if critic is not None else None,
        )
        for attribute, value in (
            ("name", name),
            ("model", model),
            ("budget", budget),
            ("version", version),
            ("task_class", task_class),
            ("verifier", verifier),
            ("policy", policy),
            ("toolbox", toolbox),
            ("settings", settings),
            ("handoffs", routes),
            ("critic", critic),
        ):
            object.__setattr__(self, attribute, value)

    name: str
    model: Model
    budget: Budget
    version: str
    task_class: str | None
    verifier: Verifier | None
    policy: Policy | None
    toolbox: Toolbox
    settings: RunSettings
    """What is recorded with each run besides the budget (see :class:`RunSettings`)."""
    handoffs: dict[str, HandoffTo]
    """The agents the model may hand off to, by name."""
    critic: Critic | None
    """What reviews its final answers (reflection), if anything."""

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"an Agent is frozen: build a new one to change {name!r}")

    # Read-only views of the recorded settings, by the names of the constructor.
    @property
    def price(self) -> Price | None:
        """The recorded price."""
        return self.settings.price

    @property
    def planning(self) -> Planning | None:
        """How the agent plans before it writes (None: it does not)."""
        return self.settings.planning

    @property
    def max_verification_attempts(self) -> int:
        """Refused answers before ``verification_failed``."""
        return self.settings.max_verification_attempts

    @property
    def max_repeated_failures(self) -> int:
        """Identical failures in a row before ``repeated_failure``."""
        return self.settings.max_repeated_failures

    @property
    def context_limit(self) -> int | None:
        """The most JSON characters of history in the model's view."""
        return self.settings.context_limit

    @property
    def keep_recent_turns(self) -> int:
        """Turns always kept in view."""
        return self.settings.keep_recent_turns

    @property
    def wind_down_notice(self) -> str:
        """What the model is told when few steps are left."""
        return self.settings.wind_down_notice

    def reachable_agents(self) -> list[Agent]:
        """This agent and every agent it can start, theirs too, each once, this one first.

        The agents it can start are its children (``as_tool``) and the targets of its
        handoffs. A worker serves them all (``Worker``): a child or a handoff target is a runnable
        invocation any worker of the store may claim. Children started from a tool's
        body (``ToolContext.run_agent``) are not found here: their agents are known only
        when the tool runs.
        """
        found: list[Agent] = []
        seen: set[int] = set()
        todo: list[Agent] = [self]
        while todo:
            agent = todo.pop(0)
            if id(agent) in seen:
                continue
            seen.add(id(agent))
            found.append(agent)
            for tool_ in agent.toolbox.tools.values():
                child = tool_.child_agent
                if isinstance(child, Agent):
                    todo.append(child)
            todo.extend(route.agent for route in agent.handoffs.values())
        return found

    def as_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        budget: Budget | None = None,
        on_parent_end: ParentEnd | str = ParentEnd.CANCEL,
    ) -> Tool:
        """This agent as a tool another agent offers: each call runs it as a child invocation.

        The model calls the tool with ``{"goal": "..."}``. The child is an invocation of
        its own (its own history, audit chain and clean context); its outcome (its
        terminal reason, answer, detail, and what it spent) is the call's result.
        Starting it is a write in the parent's effect ledger: the child's id derives
        from the call's effect key and is recorded in the parent's ``BatchDispatched``
        before it starts, and a parent resumed after a crash asks the store for the
        child instead of starting a second one (docs/explanation/child-invocations.md).

        Args:
            name: the tool's name (default: the agent's name, if it is an identifier).
            description: what the parent's model is told (default: names the agent).
            budget: the child's share of the parent's budget (``BudgetReserved``);
                default: ``floor(left / children in the batch)`` of each limit. The
                child's own budget applies within it.
            on_parent_end: what becomes of the child if the parent ends first:
                ``cancel`` (the default: it ends ``cancelled``, naming the parent) or
                ``let_finish`` / ``detach`` (it is not cancelled with the parent).

        Raises:
            UsageError: a malformed argument (a name that is not an identifier, a
                budget that is not a valid Budget, an unknown ``on_parent_end``).
        """
        tool_name = name if name is not None else self.name
        if not isinstance(tool_name, str) or not tool_name.isidentifier():
            raise UsageError(
                f"agent {self.name}: as_tool() needs a name that is an identifier "
                f"(got {tool_name!r}); pass name=..."
            )
        if budget is not None:
            budget = _checked(self.name, "as_tool(budget=...)", Budget, budget)
        try:
            edge = ParentEnd(on_parent_end)
        except ValueError:
            choices = ", ".join(e.value for e in ParentEnd)
            raise UsageError(
                f"agent {self.name}: on_parent_end must be one of {choices}, got {on_parent_end!r}"
            ) from None
        spec = ChildSpec(budget=budget, on_parent_end=edge)
        agent = self

        async def start_child(goal: str, context: ToolContext) -> dict[str, Any]:
            outcome = await child_runs().run(agent, goal, context, key=None, spec=spec)
            return outcome.model_dump(mode="json")

        async def ask_child(effect_key: str) -> Reconciled:
            return await child_runs().ask(agent, effect_key)

        start_child.__doc__ = description or (
            f"Give a goal to the agent {self.name!r}, which works on it on its own and "
            "answers with its conclusion."
        )
        deadline = (budget.deadline_s if budget else None) or self.budget.deadline_s
        tool_ = Tool(
            start_child,
            name=tool_name,
            effect="write",
            reconcile=ask_child,
            commutes=True,  # children are invocations of their own: those of a batch run at once
            timeout_s=deadline + CHILD_TIMEOUT_MARGIN_S if deadline else DEFAULT_CHILD_TIMEOUT_S,
        )
        tool_.child = spec
        tool_.child_agent = self
        return tool_

    def with_model(self, model: Model | str) -> Agent:
        """The same agent with another model (``"openai:gpt-4.1"`` or an adapter)."""
        if isinstance(model, str):
            from loop_actors.agent.adapters import model_from_name  # noqa: PLC0415 - as in __init__

            model = model_from_name(model)
        if not callable(getattr(model, "decide", None)):
            raise UsageError(f"agent {self.name}: model must have an async decide(request) method")
        copy = object.__new__(Agent)
        for attribute in Agent.__slots__:
            object.__setattr__(copy, attribute, getattr(self, attribute))
        object.__setattr__(copy, "model", model)
        return copy

    def with_critic(self, critic: Critic | None) -> Agent:
        """The same agent with another critic (or none); its recorded settings follow.

        Raises:
            UsageError: ``critic`` is not a Critic.
        """
        if critic is not None and not isinstance(critic, Critic):
            raise UsageError(f"agent {self.name}: critic must be a Critic")
        copy = object.__new__(Agent)
        for attribute in Agent.__slots__:
            object.__setattr__(copy, attribute, getattr(self, attribute))
        object.__setattr__(copy, "critic", critic)
        settings = self.settings.model_copy(
            update={"critic": critic.settings if critic is not None else None}
        )
        object.__setattr__(copy, "settings", settings)
        return copy

    def with_tools(self, *tools: Tool) -> Agent:
        """The same agent with each of ``tools`` in place of its tool of the same name.

        The tools keep the agent's order; the settings derived from them (approval
        rules, per-tool failure limits) follow the new tools.

        Raises:
            UsageError: a tool is not a ``Tool``, or the agent has no tool of its name.
        """
        replacements: dict[str, Tool] = {}
        for item in tools:
            if not isinstance(item, Tool):
                raise UsageError(f"agent {self.name}: with_tools takes tools, got {item!r}")
            if item.name not in self.toolbox.tools:
                raise UsageError(f"agent {self.name} has no tool {item.name!r} to replace")
            replacements[item.name] = item
        toolbox = Toolbox(
            [replacements.get(name, current) for name, current in self.toolbox.tools.items()],
            default_timeout_s=self.toolbox.default_timeout_s,
        )
        settings = self.settings.model_copy(
            update={
                "tool_failure_limits": {
                    t.name: t.max_repeated_failures
                    for t in toolbox.tools.values()
                    if t.max_repeated_failures is not None
                },
                "approval_rules": approval_rules(toolbox),
            }
        )
        copy = object.__new__(Agent)
        for attribute in Agent.__slots__:
            object.__setattr__(copy, attribute, getattr(self, attribute))
        object.__setattr__(copy, "toolbox", toolbox)
        object.__setattr__(copy, "settings", settings)
        return copy

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, tools={sorted(self.toolbox.tools)})"
