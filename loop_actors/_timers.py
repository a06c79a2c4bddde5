"""Many timed waits on one trio deadline: sleeps that do not raise to wake up.

``trio.sleep`` is a cancel scope with a deadline around a wait that never ends: it
wakes up by being cancelled. Expiring a deadline cancels the scope, raises
``Cancelled`` into the task, unwinds it through the sleep's frames and catches it
in the scope: with thousands of tasks asleep at once that is about 40 us of the
trio thread per sleep, against a few for a task woken by ``reschedule``
(``bench/timers.py``).

:class:`Timers` keeps the wake-up times of many waits in one heap, served by one
system task of the trio run: that task alone sleeps on a deadline (the earliest
of the heap), and when it passes, wakes every wait that is due with
``trio.lowlevel.reschedule``: one ``Cancelled`` for all the waits due by then.
A waiting task is cancellable at any time (its entry is dropped). The deadline
is a real trio deadline, so a ``trio.testing.MockClock`` that jumps to the next
deadline jumps to these too.
"""

from __future__ import annotations

import heapq
import itertools
import math

import trio

_COMPACT_AT = 1024
"""Rebuild the heap without its dropped entries once they are this many and half of it."""


class _Entry:
    """One task waiting until ``when`` (None once woken or dropped)."""

    __slots__ = ("task",)

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task: trio.lowlevel.Task | None = task


class Timers:
    """The timed waits of one trio run (see the module): one heap, one system task."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Entry]] = []
        self._order = itertools.count()
        self._dropped = 0
        self._scope: trio.CancelScope | None = None
        self._clock = trio.lowlevel.current_clock()
        trio.lowlevel.spawn_system_task(self._serve, name="loop_actors.timers")

    async def sleep_until(self, when: float) -> None:
        """Wait until the trio clock reaches ``when``.

        Cancellation: a checkpoint, always (also when ``when`` has passed); cancelled,
        the wait is dropped.
        """
        if when <= self._clock.current_time() or math.isnan(when):
            await trio.lowlevel.checkpoint()
            return
        task = trio.lowlevel.current_task()
        if when == math.inf:
            await trio.lowlevel.wait_task_rescheduled(_abort_forever)
            return
        entry = _Entry(task)
        heapq.heappush(self._heap, (when, next(self._order), entry))
        scope = self._scope
        if scope is not None and when < scope.deadline:
            scope.deadline = when

        def abort(_: object) -> trio.lowlevel.Abort:
            entry.task = None
            self._dropped += 1
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def _serve(self) -> None:
        heap = self._heap
        now = self._clock.current_time
        while True:
            due = now()
            while heap and heap[0][0] <= due:
                task = heapq.heappop(heap)[2].task
                if task is None:
                    self._dropped -= 1
                else:
                    trio.lowlevel.reschedule(task)
            if self._dropped >= _COMPACT_AT and 2 * self._dropped >= len(heap):
                heap[:] = [item for item in heap if item[2].task is not None]
                heapq.heapify(heap)
                self._dropped = 0
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None


def _abort_forever(_: object) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.SUCCEEDED


_TIMERS: trio.lowlevel.RunVar[Timers] = trio.lowlevel.RunVar("loop_actors_timers")


def timers() -> Timers:
    """The :class:`Timers` of the current trio run (started on first use)."""
    try:
        return _TIMERS.get()
    except LookupError:
        made = Timers()
        _TIMERS.set(made)
        return made


async def sleep(seconds: float) -> None:
    """``trio.sleep`` on the run's :class:`Timers`: the same wait, cheaper to wake from.

    Raises:
        ValueError: ``seconds`` is negative or NaN (as ``trio.sleep``).

    Cancellation: a checkpoint, always.
    """
    if not seconds >= 0:
        raise ValueError("sleep length must be non-negative")
    await timers().sleep_until(trio.lowlevel.current_clock().current_time() + seconds)
