"""What passes through from user code (tools, models, services, verifiers, policies).

User code may raise anything: ``KeyboardInterrupt``, ``SystemExit``, a custom
``BaseException``, an exception whose ``__str__`` raises. All of it becomes a typed
result where the code is called. Only trio's own cancellation passes through (a
timeout, a cancelled run): it is how the runtime stops user code, not user code's
failure. A real Ctrl-C does not reach user code: the runtime's trio loops deliver it
to their main task at a checkpoint (``restrict_keyboard_interrupt_to_checkpoints``),
and tools, models and services run in other tasks, or (inline tools) with no checkpoint
in them.

trio (and ``outcome``) are imported when a function here first needs them, under a
running trio loop: importing an agent (``loop-actors submit``) imports no trio.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import outcome

T = TypeVar("T")


def is_cancellation(error: BaseException) -> bool:
    """True for trio's ``Cancelled`` (alone or in a group): it must pass through."""
    if "trio" not in sys.modules:
        return False  # nothing can be trio's Cancelled before trio is imported
    import trio  # noqa: PLC0415 - imported already: a lookup

    if isinstance(error, trio.Cancelled):
        return True
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(trio.Cancelled) is not None
    return False


async def in_child_task(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Await ``fn(*args)`` in a task of its own and return (or raise) what it gave.

    For async user code called from a controller (a verifier, a policy): a Ctrl-C
    delivered to the controller's task then arrives at this wait, not inside the user
    code, which could not tell it from its own ``KeyboardInterrupt``.

    Cancellation: a checkpoint; the child is cancelled with the caller.
    """
    import outcome  # noqa: PLC0415 - see the module's docstring
    import trio  # noqa: PLC0415

    result: list[outcome.Outcome[T]] = []

    async def child() -> None:
        try:
            result.append(outcome.Value(await fn(*args)))
        except BaseException as error:
            if is_cancellation(error):
                raise
            result.append(outcome.Error(error))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(child)
    return result[0].unwrap()


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Await a plain (blocking) function of user code run in a worker thread.

    Cancellation: a checkpoint; cancelled, the thread is abandoned (it runs on, and
    what it returns is dropped).
    """
    import trio  # noqa: PLC0415 - see the module's docstring

    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
