"""Work slots: how many runs do the runtime's own part of a turn at once.

With thousands of invocations in flight, model replies come back in bursts (the
same latency, calls started together). If every run back from its model went
straight on, the trio thread would take each of them one step (up to its first
commit), then each one step further, and so on: every run would reach its next
model call only when the whole burst had been worked through, so the runs stay
bunched turn after turn and each turn waits for all the others. A run holds a
slot while it does the runtime's work (deciding, committing, handing out its
calls); it gives it back while it waits for its model or its tools. A run that
comes back from its tools is served before one that comes back from its model,
so a turn that has begun is finished first: the runs leave a burst one by one,
spread out, and their next replies come back spread out too.

Model calls, tool calls, the policy, the verifier and the services asked on resume
never wait for a slot: a slow tool (or policy, or verifier) holds none.
"""

from __future__ import annotations

import trio

from loop_actors._errors import UsageError

DEFAULT_WORK_SLOTS = 128
"""A Runtime's work slots by default: enough for the Journal to group commits of
a hundred runs and more, few enough that a burst of replies leaves in order."""


class WorkSlots:
    """At most ``total`` runs of one Runtime doing the runtime's part of a turn at once.

    Waiters are served in order, those in the middle of a turn (back from their
    tools) before those beginning one (back from their model). A slot given back
    goes straight to the next waiter, so a run that finds a free slot never jumps
    the queue: there is a free slot only when nobody waits.
    """

    __slots__ = ("_free", "_mid_turn", "_new_turn", "total")

    def __init__(self, total: int) -> None:
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise UsageError(f"work_slots must be a whole number of at least 1, not {total!r}")
        self.total = total
        self._free = total
        self._mid_turn = trio.lowlevel.ParkingLot()
        self._new_turn = trio.lowlevel.ParkingLot()

    @property
    def free(self) -> int:
        """How many slots nobody holds now."""
        return self._free

    @property
    def waiting(self) -> int:
        """How many runs wait for a slot now."""
        return len(self._mid_turn) + len(self._new_turn)

    async def take(self, *, mid_turn: bool) -> None:
        """Wait for a slot (no wait, and no checkpoint, when one is free).

        Cancellation: a checkpoint only when it waits; cancelled, it holds no slot.
        """
        if self._free:
            self._free -= 1
            return
        # The slot is handed over by give_back: unparked means it is ours.
        await (self._mid_turn if mid_turn else self._new_turn).park()

    def give_back(self) -> None:
        """Hand the slot to the next waiter, or free it."""
        if self._mid_turn:
            self._mid_turn.unpark()
        elif self._new_turn:
            self._new_turn.unpark()
        else:
            self._free += 1


class Slot:
    """One run's hold on a :class:`WorkSlots` (or on nothing, when it has none)."""

    __slots__ = ("_slots", "held")

    def __init__(self, slots: WorkSlots | None) -> None:
        self._slots = slots
        self.held = False

    async def take(self, *, mid_turn: bool) -> None:
        """Hold a slot (see :meth:`WorkSlots.take`); nothing when held or unlimited."""
        if self._slots is not None and not self.held:
            await self._slots.take(mid_turn=mid_turn)
            self.held = True

    def give_back(self) -> None:
        """Give the slot back, if held."""
        if self.held:
            self.held = False
            assert self._slots is not None
            self._slots.give_back()
