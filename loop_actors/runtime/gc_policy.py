"""How Python's cyclic garbage collector runs while a Runtime is open (``GcPolicy``).

With thousands of invocations in flight, the objects of each one (its tasks,
coroutines, cancel scopes, events) live across its model and commit waits, so
they survive the collector's young collections and are promoted; every full
collection then walks all of them. A turn of the runtime leaves no cyclic
garbage behind (its objects are freed by reference counting), so that work finds
nothing: it was half of the CPU per turn with 2,000 to 10,000 invocations in
flight (docs/performance.md, section 4). ``GcPolicy.HOSTING`` raises the
collector's thresholds while a runtime is open, so that it runs several hundred
times less often; the interpreter's thresholds are put back when the last
runtime that changed them closes.

The thresholds are the process's (``gc.set_threshold``), shared by every thread:
runtimes open at the same time, in one thread or several, count their holds, and
the most recently opened one's thresholds apply while it is open.
"""

from __future__ import annotations

import gc
import os
import threading
from dataclasses import dataclass
from typing import ClassVar

from loop_actors._errors import UsageError

GC_ENV = "LOOP_ACTORS_GC"
"""The policy when none is given: ``hosting``, ``unchanged`` or three thresholds ``A,B,C``."""


@dataclass(frozen=True, slots=True)
class GcPolicy:
    """How the cyclic garbage collector runs while a Runtime is open.

    ``thresholds`` are ``gc.set_threshold``'s three (whole numbers, at least 1), set
    when the runtime opens and put back when it closes; None leaves the collector
    as it is. ``GcPolicy.HOSTING`` (the default) and ``GcPolicy.UNCHANGED`` are the
    two named ones.
    """

    thresholds: tuple[int, int, int] | None

    HOSTING: ClassVar[GcPolicy]
    """``(500_000, 50, 100)``: young collections after 500,000 net allocations
    instead of 700, older ones rarely (measured in docs/performance.md, section 4:
    a young collection then pauses the process about 0.3 s, every few seconds under
    load; 100,000 paused it a fifth as long, five times as often, and let the
    middle generation's collections walk every run in flight again)."""
    UNCHANGED: ClassVar[GcPolicy]
    """Leave the collector's thresholds as the application set them."""

    def __post_init__(self) -> None:
        """Refuse thresholds that are not three whole numbers of at least 1.

        Raises:
            UsageError: naming the bad value.
        """
        if self.thresholds is None:
            return
        values: object = self.thresholds
        if (
            not isinstance(values, tuple)
            or len(values) != 3
            or not all(
                isinstance(value, int) and not isinstance(value, bool) and value >= 1
                for value in values
            )
        ):
            raise UsageError(
                f"GC thresholds must be three whole numbers of at least 1, got {values!r}"
            )

    @classmethod
    def parse(cls, text: str) -> GcPolicy:
        """The policy a text names: ``hosting``, ``unchanged`` or ``A,B,C`` (``$LOOP_ACTORS_GC``).

        Raises:
            UsageError: the text names none.
        """
        word = text.strip().lower()
        if word == "hosting":
            return cls.HOSTING
        if word == "unchanged":
            return cls.UNCHANGED
        parts = [part.strip() for part in word.split(",")]
        if len(parts) != 3 or not all(part.isdigit() for part in parts):
            raise UsageError(
                f"{GC_ENV} must be 'hosting', 'unchanged' or three whole numbers "
                f"'A,B,C', got {text!r}"
            )
        first, second, third = (int(part) for part in parts)
        return cls((first, second, third))

    @classmethod
    def resolve(cls, policy: GcPolicy | None) -> GcPolicy:
        """The policy given, else ``$LOOP_ACTORS_GC``'s, else ``HOSTING``.

        Raises:
            UsageError: ``policy`` is not a GcPolicy, or the variable names none.
        """
        if policy is not None:
            if not isinstance(policy, GcPolicy):
                raise UsageError(f"gc_policy must be a GcPolicy, got {type(policy).__name__}")
            return policy
        text = os.environ.get(GC_ENV)
        if text:
            return cls.parse(text)
        return cls.HOSTING


GcPolicy.HOSTING = GcPolicy((500_000, 50, 100))
GcPolicy.UNCHANGED = GcPolicy(None)


class _Holds:
    """The policies of the open runtimes that changed the thresholds, in opening order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[GcHold] = []
        self._saved: tuple[int, int, int] = gc.get_threshold()

    def take(self, hold: GcHold) -> None:
        with self._lock:
            if not self._held:
                self._saved = gc.get_threshold()
            self._held.append(hold)
            self._apply()

    def give_back(self, hold: GcHold) -> None:
        with self._lock:
            for index, held in enumerate(self._held):
                if held is hold:
                    del self._held[index]
                    break
            else:
                return
            self._apply()

    def _apply(self) -> None:
        if self._held:
            thresholds = self._held[-1].policy.thresholds
            assert thresholds is not None  # only policies that change them are held
            gc.set_threshold(*thresholds)
        else:
            gc.set_threshold(*self._saved)


_HOLDS = _Holds()


class GcHold:
    """One open runtime's claim on the collector's thresholds."""

    def __init__(self, policy: GcPolicy) -> None:
        """Name the policy; nothing changes until :meth:`take`."""
        self.policy = policy

    def take(self) -> None:
        """Apply the policy's thresholds (nothing for ``UNCHANGED``)."""
        if self.policy.thresholds is not None:
            _HOLDS.take(self)

    def give_back(self) -> None:
        """Drop this claim (safe to call twice).

        The thresholds of the newest other open runtime apply, or, when none is left,
        those from before the first one opened.
        """
        if self.policy.thresholds is not None:
            _HOLDS.give_back(self)
