"""The Runtime for asyncio programs: ``async with AsyncioRuntime(url) as runtime:``.

The runtime is written for trio, and a trio function cannot be awaited from an
asyncio task ("must be called from async context"). :class:`AsyncioRuntime` runs
a :class:`Runtime` under ``trio.run`` in a thread of its own, for as long as it
is open, and gives asyncio awaitable forms of its methods. Each call is handed
to the trio thread (``TrioToken.run_sync_soon``) as a trio task, and its result
or exception comes back to the caller's event loop
(``loop.call_soon_threadsafe``).

Why a thread and not trio's guest mode (``trio.lowlevel.start_guest_run``, trio
running inside asyncio's loop)? Guest mode saves a thread hop per call (a few
microseconds; a turn costs milliseconds), but:

- the two loops share one thread, so a blocking asyncio handler stalls the
  runtime's timeouts, deadlines and cancel polling, and a slow synchronous step
  on the trio side stalls the web server;
- only one trio run may exist in a thread: a second ``AsyncioRuntime`` (two
  stores) in the same loop would fail with "Attempted to call run() from inside
  a run()", and so would the blocking helpers that start a trio run of their
  own (``Runtime.run_sync``, ``mcp_tools``) when called from that thread.

A thread keeps the two event loops apart, allows any number of runtimes, and
costs one thread per open runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Collection, Iterable
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import trio

from aggregates.invocation import Invocation, InvocationEvent
from loop_actors._errors import UsageError
from loop_actors._logs import package_logger
from loop_actors.agent.agent import Agent
from loop_actors.runtime.outcome import Outcome
from loop_actors.runtime.runtime import CancelResult, ReconcileReport, Runtime
from loop_actors.runtime.submission import DEFAULT_SUBMIT_CHUNK, Submission
from loop_actors.store.url import redacted_url
from loop_actors.telemetry.otel import caller_context, in_caller_context

log = package_logger(__name__)

T = TypeVar("T")


class _Call:
    """One call handed to the trio thread: its cancel scope and whether the caller cancelled."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.cancelled_by_caller = False
        self.trace_context = caller_context()
        """The caller's OpenTelemetry context (its current span), current in the trio task."""

    def cancel(self) -> None:
        """Run in the trio thread: cancel the call (before or after it started)."""
        self.cancelled_by_caller = True
        self.scope.cancel()


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    """Run in the caller's loop: give the call's result, unless the future is settled already."""
    if future.done():
        return
    if isinstance(error, asyncio.CancelledError):
        future.cancel()
    elif error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen: a caller that stopped waiting does not see it."""
    if not future.cancelled():
        future.exception()


class AsyncioRuntime:
    """A :class:`Runtime` for asyncio programs (FastAPI, aiohttp, ...), run in a thread of its own.

    ``async with AsyncioRuntime(url) as runtime:`` opens the store in a new
    thread that runs trio, and closes it on exit; inside, ``await runtime.run(...)``
    and the other methods work as the trio :class:`Runtime`'s, with the same
    arguments, results and exceptions (``InvocationNotFoundError`` is raised as
    itself). Concurrent calls run concurrently on the one runtime and share its
    Journal (group commit) and its MCP sessions.

    Cancelling the asyncio task that awaits a call cancels the call in the trio
    thread: a run records ``cancelled``, as when a trio caller's scope is
    cancelled; the task waits for that to be recorded, then gets its
    ``CancelledError``. Closing the runtime while calls are still running cancels
    them the same way; their callers get ``UsageError``.

    The agent's model and tools are called in the trio thread: write them as for
    the trio runtime (plain functions, or async functions that use trio or
    anyio-based libraries such as httpx, not asyncio-only ones).
    """

    def __init__(
        self,
        db_url: str | None = None,
        *,
        now: Callable[[], datetime] | None = None,
        follow_projections: bool = False,
        views: str | None = None,
    ) -> None:
        """Prepare a runtime on ``db_url``; no I/O, no thread yet (see :class:`Runtime`).

        Raises:
            StoreUrlError: the URL is malformed.
        """
        options: dict[str, Any] = {"follow_projections": follow_projections, "views": views}
        if now is not None:
            options["now"] = now
        self._runtime = Runtime(db_url, **options)
        self.db_url = self._runtime.db_url
        self._state = "new"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._stop_requested = threading.Event()
        self._finished: asyncio.Future[None] | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        """Calls not answered yet (touched only in the caller's loop)."""
        self._active: set[_Call] = set()
        """Calls running in the trio thread (touched only there)."""

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> AsyncioRuntime:
        """Start the trio thread and open the store in it.

        Raises:
            StoreUnavailableError: the database cannot be opened (the thread has ended).
            UsageError: this runtime was opened before.

        Cancellation: cancelled while opening, the thread is told to stop and waited for.
        """
        if self._state != "new":
            raise UsageError(
                "this AsyncioRuntime was opened before; create a new one to open it again"
            )
        self._state = "open"
        loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()
        finished: asyncio.Future[None] = loop.create_future()
        finished.add_done_callback(self._fail_pending)
        self._loop, self._finished = loop, finished
        self._thread = threading.Thread(
            target=self._run_thread,
            args=(loop, started, finished),
            name=f"loop-actors trio ({redacted_url(self.db_url)})",
            daemon=True,  # an unclosed runtime does not keep the interpreter alive
        )
        self._thread.start()
        try:
            await asyncio.shield(started)
        except asyncio.CancelledError:
            await self.aclose()
            raise
        except BaseException:
            self._state = "closed"
            await asyncio.wait([finished])
            self._thread.join()  # it has returned from trio.run: at once
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the runtime (see :meth:`aclose`)."""
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the trio thread: the runtime's Journal answers every commit, then the store closes.

        Calls still running are cancelled (runs record ``cancelled``). Closing again,
        or closing a runtime never opened, does nothing.

        Raises:
            Exception: what closing the runtime raised in the trio thread (once).

        Cancellation: the close goes on in the thread; the caller stops waiting for it.
        """
        if self._state == "new":
            self._state = "closed"
            return
        finished = self._finished
        assert finished is not None
        if self._state == "closed":
            await asyncio.wait([finished])
            return
        self._state = "closed"
        self._request_stop()
        await asyncio.shield(finished)
        if self._thread is not None:
            self._thread.join()  # it has returned from trio.run: at once

    def _request_stop(self) -> None:
        """Tell the trio side to stop (before or after it opened)."""
        # The flag first, the token second; the trio side sets the token, then reads
        # the flag: one of the two sides sees the other.
        self._stop_requested.set()
        token, stop = self._token, self._stop
        if token is not None and stop is not None:
            # trio has returned already: nothing is left to stop.
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(stop.set)

    def _run_thread(
        self,
        loop: asyncio.AbstractEventLoop,
        started: asyncio.Future[None],
        finished: asyncio.Future[None],
    ) -> None:
        """The thread: ``trio.run`` of the runtime, its ending handed to the caller's loop."""
        error: BaseException | None = None
        try:
            trio.run(self._serve, loop, started)
        except BaseException as raised:  # given to the caller of aclose, not lost
            error = raised
        self._deliver(loop, finished, None, error)

    async def _serve(self, loop: asyncio.AbstractEventLoop, started: asyncio.Future[None]) -> None:
        opened = False
        try:
            async with self._runtime, trio.open_nursery() as nursery:
                self._nursery, self._stop = nursery, trio.Event()
                self._token = trio.lowlevel.current_trio_token()
                opened = True
                self._deliver(loop, started, None, None)
                if not self._stop_requested.is_set():
                    await self._stop.wait()
                self._stop.set()  # no new call starts from here on
                for call in self._active:  # calls still running end ``cancelled``
                    call.scope.cancel()
        except Exception as error:
            if opened:
                raise
            self._deliver(loop, started, None, error)

    @staticmethod
    def _deliver(
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
        value: Any,
        error: BaseException | None,
    ) -> None:
        try:
            loop.call_soon_threadsafe(_settle, future, value, error)
        except RuntimeError:  # the caller's loop is closed: nobody waits any more
            log.warning(
                "the asyncio loop closed before an AsyncioRuntime call returned: %r",
                error if error is not None else value,
            )

    def _fail_pending(self, finished: asyncio.Future[None]) -> None:
        """The trio thread ended: a call it never answered fails (none should be left)."""
        for future in list(self._pending):
            _settle(future, None, UsageError("the runtime closed before the call was answered"))

    # ----------------------------------------------------------------- calls

    async def _call(self, fn: Callable[[Runtime], Awaitable[T]]) -> T:
        """Run ``fn(runtime)`` as a trio task in the runtime's thread and return its result.

        Raises:
            UsageError: the runtime is not open, or was opened on another event loop.
        """
        if self._state != "open" or self._token is None:
            raise UsageError(
                "the AsyncioRuntime is not open: use `async with AsyncioRuntime(...) as runtime:`"
            )
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            raise UsageError("an AsyncioRuntime is used from the event loop that opened it")
        future: asyncio.Future[T] = loop.create_future()
        future.add_done_callback(_retrieve)
        future.add_done_callback(self._pending.discard)
        self._pending.add(future)
        call = _Call()
        try:
            self._token.run_sync_soon(self._start, fn, call, loop, future)
        except trio.RunFinishedError:
            self._pending.discard(future)
            raise UsageError("the AsyncioRuntime is closed") from None
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if future.done():
                raise
            # Cancel the trio call too, and wait for it to record how it ended.
            # If trio has returned, the call was answered or failed already.
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(call.cancel)
            await asyncio.wait([future])  # a second cancellation stops this wait only
            raise

    def _start(
        self,
        fn: Callable[[Runtime], Awaitable[T]],
        call: _Call,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[T],
    ) -> None:
        """In the trio thread (from ``run_sync_soon``, which must not raise): start the call."""
        assert self._nursery is not None
        assert self._stop is not None
        if self._stop.is_set():  # the runtime is closing
            self._deliver(loop, future, None, UsageError("the AsyncioRuntime is closed"))
            return
        self._active.add(call)
        self._nursery.start_soon(self._answer, fn, call, loop, future)

    async def _answer(
        self,
        fn: Callable[[Runtime], Awaitable[T]],
        call: _Call,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[T],
    ) -> None:
        value: T | None = None
        error: BaseException | None = None
        try:
            with call.scope, in_caller_context(call.trace_context):
                try:
                    value = await fn(self._runtime)
                except Exception as raised:  # the caller's exception, raised in its own task
                    error = raised
        finally:
            self._active.discard(call)
        if call.scope.cancelled_caught:
            error = (
                asyncio.CancelledError()
                if call.cancelled_by_caller
                else UsageError("the AsyncioRuntime closed during the call; it was cancelled")
            )
        self._deliver(loop, future, value, error)

    # ----------------------------------------------------------------- the Runtime's methods

    async def run(
        self,
        agent: Agent,
        goal: str,
        *,
        invocation_id: str | None = None,
        task_class: str | None = None,
        actor: str | None = None,
        tenant: str | None = None,
    ) -> Outcome:
        """:meth:`Runtime.run`, awaited from asyncio.

        Cancellation: cancelling the awaiting task records the invocation as
        ``cancelled`` (as a cancelled trio scope does); the task gets
        ``CancelledError`` once that is recorded.
        """
        return await self._call(
            lambda runtime: runtime.run(
                agent,
                goal,
                invocation_id=invocation_id,
                task_class=task_class,
                actor=actor,
                tenant=tenant,
            )
        )

    async def resume(
        self,
        invocation_id: str,
        agent: Agent,
        *,
        allow_catalogue_change: bool = False,
        allow_settings_change: bool = False,
        take_over: bool = False,
    ) -> Outcome:
        """:meth:`Runtime.resume`, awaited from asyncio. Cancellation: as :meth:`run`."""
        return await self._call(
            lambda runtime: runtime.resume(
                invocation_id,
                agent,
                allow_catalogue_change=allow_catalogue_change,
                allow_settings_change=allow_settings_change,
                take_over=take_over,
            )
        )

    async def submit(
        self,
        agent: Agent,
        goal: str,
        *,
        invocation_id: str | None = None,
        task_class: str | None = None,
        actor: str | None = None,
        tenant: str | None = None,
        agent_ref: str | None = None,
    ) -> str:
        """:meth:`Runtime.submit`, awaited from asyncio.

        Cancellation: cancelled, the invocation is recorded or not; submitting again with
        the same id is safe.
        """
        return await self._call(
            lambda runtime: runtime.submit(
                agent,
                goal,
                invocation_id=invocation_id,
                task_class=task_class,
                actor=actor,
                tenant=tenant,
                agent_ref=agent_ref,
            )
        )

    async def submit_many(
        self,
        agent: Agent,
        goals: Iterable[str | Submission],
        *,
        agent_ref: str | None = None,
        chunk_size: int = DEFAULT_SUBMIT_CHUNK,
    ) -> list[str]:
        """:meth:`Runtime.submit_many`, awaited from asyncio.

        Cancellation: cancelled, the chunks before the one in hand are recorded, that one
        is recorded or not; submitting the same goals again submits none with an id twice.
        """
        goals = list(goals)  # read here, in the caller's thread
        return await self._call(
            lambda runtime: runtime.submit_many(
                agent, goals, agent_ref=agent_ref, chunk_size=chunk_size
            )
        )

    async def approve(
        self, invocation_id: str, *, digest: str, by: str, note: str | None = None
    ) -> None:
        """:meth:`Runtime.approve`, awaited from asyncio.

        Cancellation: cancelled, the approval is recorded or not; approving again is safe.
        """
        await self._call(
            lambda runtime: runtime.approve(invocation_id, digest=digest, by=by, note=note)
        )

    async def deny(self, invocation_id: str, *, by: str, reason: str) -> None:
        """:meth:`Runtime.deny`, awaited from asyncio. Cancellation: as :meth:`approve`."""
        await self._call(lambda runtime: runtime.deny(invocation_id, by=by, reason=reason))

    async def clarify(self, invocation_id: str, *, answer: str, by: str | None = None) -> None:
        """:meth:`Runtime.clarify`, awaited from asyncio. Cancellation: as :meth:`approve`."""
        await self._call(lambda runtime: runtime.clarify(invocation_id, answer=answer, by=by))

    async def wake(self, invocation_id: str, *, by: str | None = None) -> bool:
        """:meth:`Runtime.wake`, awaited from asyncio. Cancellation: as :meth:`approve`."""
        return await self._call(lambda runtime: runtime.wake(invocation_id, by=by))

    async def request_cancel(
        self, invocation_id: str, *, by: str | None = None, reason: str | None = None
    ) -> CancelResult:
        """:meth:`Runtime.request_cancel`, awaited from asyncio.

        Cancellation: as the trio method's: the request is recorded or not; asking
        again is safe.
        """
        return await self._call(
            lambda runtime: runtime.request_cancel(invocation_id, by=by, reason=reason)
        )

    async def reconcile(
        self, agent: Agent, *, invocation_ids: Collection[str] | None = None
    ) -> ReconcileReport:
        """:meth:`Runtime.reconcile`, awaited from asyncio. Cancellation: as :meth:`run`."""
        return await self._call(
            lambda runtime: runtime.reconcile(agent, invocation_ids=invocation_ids)
        )

    async def history(self, invocation_id: str) -> list[InvocationEvent]:
        """:meth:`Runtime.history`, awaited from asyncio. Cancellation: nothing changes."""
        return await self._call(lambda runtime: runtime.history(invocation_id))

    async def load(self, invocation_id: str) -> Invocation:
        """:meth:`Runtime.load`, awaited from asyncio. Cancellation: nothing changes."""
        return await self._call(lambda runtime: runtime.load(invocation_id))


__all__ = ["AsyncioRuntime"]
