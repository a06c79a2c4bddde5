"""Authorisation: a policy over actor, tenant, object and operation, checked before dispatch."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aggregates.decisions import Frozen
from aggregates.revalidation import MalformedValueError, revalidated
from aggregates.values import describe_error, safe_text
from loop_actors._guard import in_child_task, is_cancellation

T = TypeVar("T")


class AccessRequest(Frozen):
    """What a policy decides on: who asks to do what to which object, for whom."""

    actor: str | None
    tenant: str | None
    operation: str
    """The tool's declared operation (default: the tool's name)."""
    object: Any = None
    """The value of the tool's declared object argument (``object_from``), if any."""
    tool: str
    arguments: dict[str, Any]


class Deny(Frozen):
    """A policy's refusal: the call gets a ``denied`` result, or, with ``stop``, the run ends."""

    reason: str
    stop: bool = False
    """End the invocation (``invalid_decision``) instead of telling the model."""


Policy = Callable[[AccessRequest], Any]
"""``policy(request)``: True allows; False or ``Deny(...)`` refuses. Plain or async.

A policy that raises refuses (the safe side), and so does one that answers a malformed
``Deny`` (built with ``model_construct``: it is validated again).
"""


async def check_access(policy: Policy, request: AccessRequest) -> Deny | None:
    """Ask the policy; None when the call is allowed.

    Cancellation: a checkpoint when the policy is async; ``trio.Cancelled`` passes
    through (nothing is recorded: the batch was not dispatched, a retry is safe).
    """
    try:
        verdict = policy(request)
        if inspect.isawaitable(verdict):
            verdict = await in_child_task(_awaited, verdict)
    except BaseException as error:  # a policy that breaks (in any way) refuses
        if is_cancellation(error):
            raise
        return Deny(reason=f"the policy raised {describe_error(error)}")
    if verdict is True:
        return None
    if isinstance(verdict, Deny):
        try:
            # Validated again: one built with model_construct may hold anything.
            deny = revalidated(Deny, verdict)
        except MalformedValueError as error:  # refuses, as a policy that raises does
            return Deny(reason=f"the policy answered {error}")
        return deny.model_copy(update={"reason": safe_text(deny.reason)})
    return Deny(reason=f"{request.actor or 'this actor'} may not {request.operation}")


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
