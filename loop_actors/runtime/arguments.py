"""Checks of what callers give the runtime, made before anything is opened or written."""

from __future__ import annotations

from aggregates.ids import invocation_id_problem
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


def check_start(
    caller: str,
    agent: object,
    goal: object,
    *,
    invocation_id: str | None,
    task_class: str | None,
    actor: str | None,
    tenant: str | None,
    agent_ref: str | None = None,
) -> None:
    """Refuse malformed arguments of ``run`` / ``submit`` before anything is written.

    Raises:
        UsageError: what is wrong with them.
    """
    if not isinstance(agent, Agent):
        raise UsageError(f"{caller}() needs an Agent, got {type(agent).__name__}")
    if not isinstance(goal, str) or not goal.strip():
        raise UsageError("the goal must be a non-empty string")
    if invocation_id is not None:
        check_invocation_id(invocation_id)
    check_texts(
        goal=goal,
        invocation_id=invocation_id,
        task_class=task_class,
        actor=actor,
        tenant=tenant,
        agent_ref=agent_ref,
    )


def requested_by(by: str | None, reason: str | None) -> str:
    """How a recorded cancel request reads in a run's detail (``requested by X (why)``)."""
    return "requested" + (f" by {by}" if by else "") + (f" ({reason})" if reason else "")
