"""Checks of what callers give the runtime, made before anything is opened or written."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import uuid4

from aggregates.children import ParentLink
from aggregates.decisions import Budget
from aggregates.fork_origin import ForkOrigin
from aggregates.handoffs import HandoffOrigin
from aggregates.ids import invocation_id_problem
from aggregates.invocation import Invocation, TraceParent
from aggregates.values import check_text
from loop_actors._errors import UsageError
from loop_actors.agent.agent import Agent


def check_invocation_id(invocation_id: object) -> None:
    """Refuse an id that cannot name an invocation (before anything is written).

    Raises:
        UsageError: not a non-empty string, in the runtime's own namespaces
            (``cancel:…``, ``eff-…``), or with a control character.
    """
    if not isinstance(invocation_id, str):
        raise UsageError(f"an invocation id must be a string, got {type(invocation_id).__name__}")
    problem = invocation_id_problem(invocation_id)
    if problem is not None:
        raise UsageError(problem)


def check_texts(**texts: str | None) -> None:
    """Refuse text a caller gives that cannot be stored (a lone surrogate, e.g. from argv).

    Raises:
        UsageError: naming the argument and the problem.
    """
    for name, text in texts.items():
        if text is None:
            continue
        if not isinstance(text, str):
            raise UsageError(f"{name} must be a string, got {type(text).__name__}")
        problem = check_text(text)
        if problem is not None:
            raise UsageError(f"{name} cannot be stored: it holds {problem}")


@dataclass(frozen=True, kw_only=True, slots=True)
class StartRequest:
    """What ``Runtime.run`` or ``Runtime.submit`` was asked to start: built once, passed down.

    The Runtime builds it from its caller's arguments, checks it (:meth:`check`) and
    hands it to the Driver, which starts the invocation from it.
    """

    agent: Agent
    goal: str
    invocation_id: str | None = None
    """The id the caller chose (None: a new random one)."""
    task_class: str | None = None
    """Recorded for metrics (None: the agent's)."""
    actor: str | None = None
    tenant: str | None = None
    agent_ref: str | None = None
    """``submit`` only: the ``MODULE:ATTR`` the agent is loaded from, kept with the queue row."""
    parent: ParentLink | None = None
    """For a child invocation (started by the runtime, never by a caller): its parent."""
    budget: Budget | None = None
    """For a child invocation: its budget within its share of the parent's (None: the agent's)."""
    handed_off_from: HandoffOrigin | None = None
    """For the target of a handoff (started by the runtime): where it comes from."""
    trace_parent: TraceParent | None = None
    """The caller's current span (when tracing is on); a child's trace comes from its root."""
    forked_from: ForkOrigin | None = None
    """For the replay of a fork: where the recorded fork came from (its writes' judgement)."""

    def check(self, caller: str) -> None:
        """Refuse a malformed request of ``caller`` (``run``, ``submit``): nothing is written.

        Raises:
            UsageError: what is wrong with it.
        """
        agent: object = self.agent  # whatever the caller passed, typed or not
        if not isinstance(agent, Agent):
            raise UsageError(f"{caller}() needs an Agent, got {type(agent).__name__}")
        goal: object = self.goal
        if not isinstance(goal, str) or not goal.strip():
            raise UsageError("the goal must be a non-empty string")
        if self.invocation_id is not None:
            check_invocation_id(self.invocation_id)
        check_texts(
            goal=goal,
            invocation_id=self.invocation_id,
            task_class=self.task_class,
            actor=self.actor,
            tenant=self.tenant,
            agent_ref=self.agent_ref,
        )


def new_invocation(request: StartRequest, *, at: datetime) -> Invocation:
    """A new invocation as ``request`` asks, its ``InvocationStarted`` pending (not committed)."""
    agent = request.agent
    return Invocation.start(
        invocation_id=request.invocation_id or uuid4().hex,
        goal=request.goal,
        agent_name=agent.name,
        agent_version=agent.version,
        catalogue_digest=agent.toolbox.catalogue_digest,
        tools=agent.toolbox.specs,
        budget=request.budget if request.budget is not None else agent.budget,
        settings=agent.settings,
        task_class=request.task_class if request.task_class is not None else agent.task_class,
        actor=request.actor,
        tenant=request.tenant,
        at=at,
        parent=request.parent,
        handed_off_from=request.handed_off_from,
        trace_parent=request.trace_parent,
        forked_from=request.forked_from,
    )


def requested_by(by: str | None, reason: str | None) -> str:
    """How a recorded cancel request reads in a run's detail (``requested by X (why)``)."""
    return "requested" + (f" by {by}" if by else "") + (f" ({reason})" if reason else "")
