"""Schedules: when an agent's runs are due, and what a check of a schedule decides.

Pure: no clock, no database. Times are seconds since the epoch, passed in; a due time
is a whole second. The workers (``loop_actors.workers``) read a schedule's row from the
store with the store's time, hand both here (:func:`check_schedule`), write the row
this returns and submit the runs it names, each under the invocation id that
:func:`scheduled_invocation_id` derives from the schedule and the due time, so that a
due time is never submitted twice, whoever submits it and however often.

A schedule's timing is :class:`Every` (``--every 15m``: the multiples of the interval
since the epoch, in UTC) or :class:`Cron` (``--cron "0 9 * * 1-5" --tz Europe/Paris``:
the five standard fields, matched in the wall-clock time of the zone). Through a change
of the zone's offset, each wall-clock time that matches runs once: a time that does not
exist (spring forward: 02:30 on that day) runs at the first instant after the gap (03:00
there), once even if several matching times fall in the gap; a time that exists twice
(fall back) runs at its first occurrence only.

A due time a check finds past is handled by the schedule's :class:`CatchUp` (how many
of the due times passed meanwhile run), then by its :class:`Overlap` (what happens
while the previous run has not ended).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import cache
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field

from aggregates.decisions import Frozen
from aggregates.errors import AggregateError
from aggregates.ids import invocation_id_problem
from aggregates.lease import QueueStatus

DEFAULT_TIME_ZONE = "UTC"
"""The zone a cron expression is read in when none is given."""

MISSED_AFTER_S = 30.0
"""A due time more than this late when a check finds it is missed (``catch_up=none``)."""

RESUBMIT_AFTER_S = 5.0
"""A run decided this long ago whose invocation is still not in the store is submitted
again, by any worker (the one that decided it died before it submitted it)."""

CATCH_UP_AT_MOST = 100
"""Due times one check decides at most (``catch_up=all``); the next check goes on."""

LONGEST_EVERY_S = 366 * 24 * 3600
"""The longest ``--every`` interval (a year)."""

SEARCH_YEARS = 30
"""How far ahead a cron expression is searched for its next match (Feb 29 on a Monday is
up to 28 years away)."""

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A schedule's name: it is part of its runs' invocation ids."""


class ScheduleProblem(StrEnum):
    """What is wrong with a schedule's definition."""

    BAD_NAME = "bad_name"
    """The name is not 1 to 64 letters, digits, ``.``, ``_`` or ``-``, starting with a
    letter or a digit."""
    BAD_INTERVAL = "bad_interval"
    """``--every`` is not a whole number of seconds, minutes or hours, at least 1s."""
    MALFORMED_CRON = "malformed_cron"
    """The cron expression is not five valid fields."""
    NEVER_DUE = "never_due"
    """The cron expression matches no day (``0 0 31 2 *``)."""
    UNKNOWN_TIME_ZONE = "unknown_time_zone"
    """The time zone is not in the IANA database."""
    TIME_ZONE_WITHOUT_CRON = "time_zone_without_cron"
    """A time zone was given with ``--every`` (which counts in UTC)."""
    MISSING_GOAL = "missing_goal"
    """The goal is empty."""


class ScheduleSpecError(AggregateError, ValueError):
    """Raised when a schedule's definition is malformed; ``problem`` says how."""

    def __init__(self, problem: ScheduleProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


class Overlap(StrEnum):
    """What a due time does while the schedule's previous run has not ended."""

    SKIP = "skip"
    """It is not run (counted as skipped)."""
    QUEUE = "queue"
    """It waits, and is submitted once the previous run has ended (one at a time)."""
    ALLOW = "allow"
    """It is submitted at once: runs of the schedule may run side by side."""


class CatchUp(StrEnum):
    """Which of the due times that passed while no worker checked the schedule run."""

    NONE = "none"
    """None that was missed: only a due time at most ``MISSED_AFTER_S`` late, the latest."""
    ONE = "one"
    """One: the latest of them."""
    ALL = "all"
    """Every one, in order (at most ``CATCH_UP_AT_MOST`` a check)."""


class ScheduleState(StrEnum):
    """Whether a schedule's due times are run."""

    ACTIVE = "active"
    PAUSED = "paused"
    """Its due times pass unrun; resumed, it runs from its next due time on."""


DEFAULT_OVERLAP = Overlap.SKIP
DEFAULT_CATCH_UP = CatchUp.ONE


# --------------------------------------------------------------------------- timings


class Every(Frozen):
    """A fixed interval: due at every multiple of ``seconds`` since the epoch (UTC)."""

    kind: Literal["every"] = "every"
    seconds: Annotated[int, Field(ge=1, le=LONGEST_EVERY_S)]

    @property
    def text(self) -> str:
        """As ``--every`` takes it: ``15m``, ``2h``, ``90s``."""
        for unit, size in (("h", 3600), ("m", 60)):
            if self.seconds % size == 0:
                return f"{self.seconds // size}{unit}"
        return f"{self.seconds}s"


class Cron(Frozen):
    """Five cron fields (minute, hour, day of month, month, day of week) in a zone's wall time.

    Built by :func:`parse_cron`, which checks both.
    """

    kind: Literal["cron"] = "cron"
    expression: str
    time_zone: str = DEFAULT_TIME_ZONE

    @property
    def text(self) -> str:
        """The expression and its zone."""
        return f"{self.expression} ({self.time_zone})"


Timing = Every | Cron

_EVERY = re.compile(r"(\d+)([smh])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


def parse_every(text: str) -> Every:
    """``--every``: ``Ns``, ``Nm`` or ``Nh``, N a whole number of at least 1.

    Raises:
        ScheduleSpecError: ``bad_interval``.
    """
    found = _EVERY.fullmatch(text.strip())
    if found is None:
        raise ScheduleSpecError(
            ScheduleProblem.BAD_INTERVAL,
            f"--every takes a whole number and s, m or h (30s, 15m, 2h), got {text!r}",
        )
    seconds = int(found[1]) * _UNIT_S[found[2]]
    if seconds < 1:
        raise ScheduleSpecError(
            ScheduleProblem.BAD_INTERVAL, f"--every must be at least 1s, got {text!r}"
        )
    if seconds > LONGEST_EVERY_S:
        raise ScheduleSpecError(
            ScheduleProblem.BAD_INTERVAL, f"--every must be at most 8784h (a year), got {text!r}"
        )
    return Every(seconds=seconds)


def time_zone(name: str) -> ZoneInfo:
    """The IANA zone ``name`` (``Europe/Paris``, ``UTC``).

    Raises:
        ScheduleSpecError: ``unknown_time_zone``.
    """
    if not name or name != name.strip() or name.startswith(("/", ".")) or ".." in name:
        raise ScheduleSpecError(
            ScheduleProblem.UNKNOWN_TIME_ZONE, f"unknown time zone {name!r} (e.g. Europe/Paris)"
        )
    try:
        return _zone(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleSpecError(
            ScheduleProblem.UNKNOWN_TIME_ZONE,
            f"unknown time zone {name!r}: give an IANA name such as Europe/Paris or UTC",
        ) from None


@cache
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def parse_cron(expression: str, tz: str | None = None) -> Cron:
    """A cron timing: five fields read in the wall time of ``tz`` (default UTC).

    Each field is ``*``, a value, a range ``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n``,
    or a list of those (``1,15,30-40/5``); months and days of the week may be named
    (``jan``, ``mon-fri``); a day of the week is 0 to 7, 0 and 7 both Sunday. When both
    the day of the month and the day of the week are restricted (neither starts with
    ``*``), a day matching either runs, as cron does.

    Raises:
        ScheduleSpecError: ``malformed_cron``, ``never_due`` or ``unknown_time_zone``.
    """
    zone_name = DEFAULT_TIME_ZONE if tz is None else tz
    time_zone(zone_name)
    text = " ".join(expression.split())
    fields = _cron_fields(text)
    if not fields.some_day_exists():
        raise ScheduleSpecError(
            ScheduleProblem.NEVER_DUE,
            f"cron {text!r} never runs: none of its months has such a day of the month",
        )
    return Cron(expression=text, time_zone=zone_name)


def parse_timing(
    *, every: str | None = None, cron: str | None = None, tz: str | None = None
) -> Timing:
    """The timing of ``--every`` or ``--cron`` (with ``--tz``): exactly one of them.

    Raises:
        ScheduleSpecError: what is wrong with it (``time_zone_without_cron`` when ``tz``
            comes with ``every``).
        ValueError: neither or both of ``every`` and ``cron``.
    """
    if (every is None) == (cron is None):
        raise ValueError("a schedule has one timing: every or cron")
    if every is not None:
        if tz is not None:
            raise ScheduleSpecError(
                ScheduleProblem.TIME_ZONE_WITHOUT_CRON,
                "--tz is for --cron (its wall-clock time); --every counts in UTC",
            )
        return parse_every(every)
    assert cron is not None
    return parse_cron(cron, tz)


def check_schedule_name(name: str) -> None:
    """Refuse a name that cannot be part of an invocation id.

    Raises:
        ScheduleSpecError: ``bad_name``.
    """
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise ScheduleSpecError(
            ScheduleProblem.BAD_NAME,
            f"a schedule's name is 1 to 64 letters, digits, '.', '_' or '-', starting with "
            f"a letter or a digit, got {name!r}",
        )
    problem = invocation_id_problem(scheduled_invocation_id(name, 0))
    if problem is not None:
        raise ScheduleSpecError(ScheduleProblem.BAD_NAME, f"schedule {name!r}: {problem}")


# --------------------------------------------------------------------------- cron fields

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_LONGEST_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    """Names of the values from ``low`` on (months from 1, days from 0)."""


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, _MONTHS),
    _Field("day of week", 0, 7, _DAYS),
)


@dataclass(frozen=True, slots=True)
class CronFields:
    """A parsed cron expression: the values each field matches, sorted."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]
    """0 is Sunday (7 is read as 0)."""
    days_restricted: bool
    weekdays_restricted: bool

    def day_matches(self, day: datetime) -> bool:
        """Whether the date of ``day`` is one of the expression's days."""
        in_month = day.day in self.days
        in_week = day.isoweekday() % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_month or in_week
        return in_month and in_week

    def some_day_exists(self) -> bool:
        """Whether some month of the expression has one of its days (or a weekday decides)."""
        if self.days_restricted and self.weekdays_restricted:
            return True
        return any(day <= _LONGEST_MONTH[month - 1] for month in self.months for day in self.days)


def _malformed(text: str, why: str) -> ScheduleSpecError:
    return ScheduleSpecError(ScheduleProblem.MALFORMED_CRON, f"cron {text!r}: {why}")


@cache
def _cron_fields(text: str) -> CronFields:
    parts = text.split(" ") if text else []
    if len(parts) != len(_FIELDS):
        raise _malformed(
            text,
            f"a cron expression has 5 fields (minute hour day-of-month month day-of-week), "
            f"got {len(parts)}",
        )
    values = [_field_values(text, part, field) for part, field in zip(parts, _FIELDS, strict=True)]
    weekdays = tuple(sorted({0 if day == 7 else day for day in values[4]}))
    return CronFields(
        minutes=values[0],
        hours=values[1],
        days=values[2],
        months=values[3],
        weekdays=weekdays,
        days_restricted=not parts[2].startswith("*"),
        weekdays_restricted=not parts[4].startswith("*"),
    )


def _field_values(text: str, part: str, field: _Field) -> tuple[int, ...]:
    found: set[int] = set()
    for item in part.split(","):
        span, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise _malformed(
                    text, f"the {field.name} step {step_text!r} is not a number of at least 1"
                )
            step = int(step_text)
        if span == "*":
            low, high = field.low, field.high
        else:
            first, dash, last = span.partition("-")
            low = _value(text, first, field)
            high = _value(text, last, field) if dash else (field.high if slash else low)
            if low > high:
                raise _malformed(text, f"the {field.name} range {span!r} runs backwards")
        found.update(range(low, high + 1, step))
    return tuple(sorted(found))


def _value(text: str, token: str, field: _Field) -> int:
    lowered = token.lower()
    if lowered in field.names:
        return field.low + field.names.index(lowered)
    if not token.isdigit():
        raise _malformed(text, f"{token!r} is not a {field.name}")
    value = int(token)
    if not field.low <= value <= field.high:
        raise _malformed(
            text, f"the {field.name} {value} is out of range ({field.low}-{field.high})"
        )
    return value


def _at_or_after(values: tuple[int, ...], value: int) -> int | None:
    """The smallest of ``values`` (sorted) that is at least ``value``."""
    at = bisect_left(values, value)
    return values[at] if at < len(values) else None


def _next_wall_time(fields: CronFields, start: datetime) -> datetime | None:
    """The first wall-clock minute at or after ``start`` (naive, whole minute) that matches."""
    t = start
    last_year = start.year + SEARCH_YEARS
    day = timedelta(days=1)
    while t.year <= last_year:
        if t.month not in fields.months:
            month = _at_or_after(fields.months, t.month)
            if month is None:
                t = datetime(t.year + 1, fields.months[0], 1)
            else:
                t = datetime(t.year, month, 1)
            continue
        if not fields.day_matches(t):
            t = datetime(t.year, t.month, t.day) + day
            continue
        if t.hour not in fields.hours:
            hour = _at_or_after(fields.hours, t.hour)
            if hour is None:
                t = datetime(t.year, t.month, t.day) + day
            else:
                t = t.replace(hour=hour, minute=0)
            continue
        if t.minute not in fields.minutes:
            minute = _at_or_after(fields.minutes, t.minute)
            if minute is None:
                t = t.replace(minute=0) + timedelta(hours=1)
            else:
                t = t.replace(minute=minute)
            continue
        return t
    return None


def _wall_time(instant: int, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(instant, zone).replace(tzinfo=None)


def _instant(wall: datetime, zone: ZoneInfo) -> int:
    """When the wall-clock time ``wall`` happens in ``zone``: its first occurrence.

    A time that exists twice (the clocks went back) is its first occurrence; one that
    does not exist (they went forward over it) is the first instant after the gap.
    """
    first = int(wall.replace(tzinfo=zone, fold=0).timestamp())
    if _wall_time(first, zone) == wall:
        return first
    # In the gap: fold=1 reads it with the offset after the change (an instant before
    # the gap), fold=0 with the offset before (after the gap). The change lies between.
    low, high = int(wall.replace(tzinfo=zone, fold=1).timestamp()), first
    while low < high:
        middle = (low + high) // 2
        if _wall_time(middle, zone) >= wall:
            high = middle
        else:
            low = middle + 1
    return low


# --------------------------------------------------------------------------- due times


def next_due_after(timing: Timing, after: float) -> int:
    """The first due time strictly after ``after`` (seconds since the epoch).

    Raises:
        ScheduleSpecError: ``never_due``: a cron expression with no match within
            ``SEARCH_YEARS`` years.
    """
    second = math.floor(after)
    if isinstance(timing, Every):
        return (second // timing.seconds + 1) * timing.seconds
    fields = _cron_fields(timing.expression)
    zone = _zone(timing.time_zone)
    # A wall time before the one of ``after`` happens before it (``_instant`` never
    # decreases); from there on, one of the hour the clocks went back over may still
    # have its first occurrence before ``after``: the loop passes over it.
    wall = _wall_time(second, zone).replace(second=0)
    while True:
        found = _next_wall_time(fields, wall)
        if found is None:
            raise ScheduleSpecError(
                ScheduleProblem.NEVER_DUE,
                f"cron {timing.expression!r} has no match within {SEARCH_YEARS} years",
            )
        instant = _instant(found, zone)
        if instant > after:
            return instant
        wall = found + timedelta(minutes=1)


def latest_due_at_or_before(timing: Timing, at: float, *, since: int) -> int:
    """The latest due time at or before ``at``, ``since`` (a due time, at most ``at``) at least."""
    if isinstance(timing, Every):
        return max(since, math.floor(at) // timing.seconds * timing.seconds)
    # Looked for in ever wider windows back from ``at``: a frequent expression is found
    # in the first hour, a rare one in a longer window, without walking every due time
    # since ``since``.
    for window in (3600, 86400, 32 * 86400, 400 * 86400, None):
        start = since if window is None else max(since, math.floor(at) - window)
        latest = None
        due = start if start == since else next_due_after(timing, start - 1)
        while due <= at:
            latest = due
            due = next_due_after(timing, due)
        if latest is not None:
            return latest
    return since


def due_times(
    timing: Timing, next_due: int, now: float, catch_up: CatchUp
) -> tuple[list[int], int]:
    """The due times a check at ``now`` runs, from ``next_due`` on, and the next due time after.

    ``next_due`` later than ``now``: none. Otherwise the due times passed since (itself
    included) are run as ``catch_up`` says: all (at most ``CATCH_UP_AT_MOST``: the next
    due time is then the one after the last, already past, for the next check), the
    latest, or the latest if it is at most ``MISSED_AFTER_S`` late.
    """
    if next_due > now:
        return [], next_due
    if catch_up is CatchUp.ALL:
        dues: list[int] = []
        due = next_due
        while due <= now and len(dues) < CATCH_UP_AT_MOST:
            dues.append(due)
            due = next_due_after(timing, due)
        return dues, due
    latest = latest_due_at_or_before(timing, now, since=next_due)
    following = next_due_after(timing, now)
    if catch_up is CatchUp.NONE and now - latest > MISSED_AFTER_S:
        return [], following
    return [latest], following


def scheduled_invocation_id(name: str, due: int) -> str:
    """The id of the run of schedule ``name`` due at ``due``: ``NAME@2025-01-06T08:00:00Z``."""
    return f"{name}@{datetime.fromtimestamp(due, UTC):%Y-%m-%dT%H:%M:%SZ}"


def due_time(due: int) -> datetime:
    """A due time as an aware datetime (UTC)."""
    return datetime.fromtimestamp(due, UTC)


# --------------------------------------------------------------------------- a schedule


class Decided(Frozen):
    """A run a check decided to submit, not yet found in the store."""

    due: int
    decided_at: float
    """When (a worker that finds it still missing ``RESUBMIT_AFTER_S`` later submits it)."""


class Schedule(Frozen):
    """A schedule as the store keeps it: its definition and where it stands."""

    name: str
    agent_name: str
    agent_ref: str | None = None
    """The ``MODULE:ATTR`` it was added with (for operators; workers serve by name)."""
    goal: str
    timing: Annotated[Timing, Field(discriminator="kind")]
    overlap: Overlap = DEFAULT_OVERLAP
    catch_up: CatchUp = DEFAULT_CATCH_UP
    state: ScheduleState = ScheduleState.ACTIVE
    next_due: int
    """The next due time not yet handled by a check."""
    waiting: tuple[int, ...] = ()
    """Due times waiting for the previous run to end (``overlap=queue``), oldest first."""
    submitting: tuple[Decided, ...] = ()
    """Runs decided whose invocations were not yet found in the store, oldest first."""
    last_due: int | None = None
    """The due time of the last run decided (its invocation is the previous run)."""
    runs: int = 0
    """Runs decided so far."""
    skipped: int = 0
    """Due times not run because the previous run had not ended (``overlap=skip``)."""
    created_at: float
    updated_at: float

    @property
    def retry_at(self) -> float | None:
        """When a decided run still missing is submitted again (None: none is missing)."""
        if not self.submitting:
            return None
        return min(run.decided_at for run in self.submitting) + RESUBMIT_AFTER_S

    def invocation_id(self, due: int) -> str:
        """The id of its run due at ``due``."""
        return scheduled_invocation_id(self.name, due)

    def looked_up(self) -> list[str]:
        """The invocations a check must find in the queue: the previous run, those decided."""
        dues = {run.due for run in self.submitting}
        if self.last_due is not None:
            dues.add(self.last_due)
        return [self.invocation_id(due) for due in sorted(dues)]


def new_schedule(
    name: str,
    *,
    agent_name: str,
    goal: str,
    timing: Timing,
    now: float,
    agent_ref: str | None = None,
    overlap: Overlap = DEFAULT_OVERLAP,
    catch_up: CatchUp = DEFAULT_CATCH_UP,
) -> Schedule:
    """A new, active schedule added at ``now``: its first due time is the next one after.

    Raises:
        ScheduleSpecError: a bad name, an empty goal, or a timing that is never due.
    """
    check_schedule_name(name)
    if not goal.strip():
        raise ScheduleSpecError(ScheduleProblem.MISSING_GOAL, "a schedule's goal must not be empty")
    return Schedule(
        name=name,
        agent_name=agent_name,
        agent_ref=agent_ref,
        goal=goal,
        timing=timing,
        overlap=Overlap(overlap),
        catch_up=CatchUp(catch_up),
        next_due=next_due_after(timing, now),
        created_at=now,
        updated_at=now,
    )


class ScheduleCheck(Frozen):
    """What one check of a schedule decided."""

    row: Schedule
    """The row to write (``updated_at`` moved when ``changed``)."""
    submit: tuple[int, ...]
    """Due times whose runs the checking worker submits now, oldest first."""
    skipped: tuple[int, ...]
    """Due times not run: the previous run had not ended (``overlap=skip``)."""
    changed: bool
    """Whether the row must be written."""


def check_schedule(
    row: Schedule, *, now: float, found: Mapping[str, QueueStatus | None]
) -> ScheduleCheck:
    """Check a schedule at ``now``: which runs to submit, and the row after.

    ``found``: the queue status of each invocation of :meth:`Schedule.looked_up`
    (None, or left out: it is not in the store). A decided run found there was
    submitted: it is forgotten. The previous run has not ended while one decided is
    not found yet, or while the last decided is there and not ``ended``.

    The due times passed (:func:`due_times`, an active schedule only) are then run as
    the overlap policy says; with ``queue``, the oldest waiting one is submitted once the
    previous run has ended. A decided run still not found ``RESUBMIT_AFTER_S`` after it
    was decided is submitted again (its id makes a second submission a no-op).
    """
    submitting = [run for run in row.submitting if found.get(row.invocation_id(run.due)) is None]
    previous = None if row.last_due is None else found.get(row.invocation_id(row.last_due))
    running = bool(submitting) or previous not in (None, QueueStatus.ENDED)
    waiting = list(row.waiting)
    fresh: list[int] = []
    skipped: list[int] = []
    next_due = row.next_due
    if row.state is ScheduleState.ACTIVE:
        dues, next_due = due_times(row.timing, row.next_due, now, row.catch_up)
        for due in dues:
            if row.overlap is Overlap.ALLOW:
                fresh.append(due)
            elif row.overlap is Overlap.QUEUE:
                waiting.append(due)
            elif running:
                skipped.append(due)
            else:
                fresh.append(due)
                running = True
        if row.overlap is Overlap.QUEUE and waiting and not running:
            fresh.append(waiting.pop(0))
    again = [run for run in submitting if run.decided_at + RESUBMIT_AFTER_S <= now]
    submit = [run.due for run in again] + fresh
    decided = [run for run in submitting if run not in again]
    decided += [Decided(due=due, decided_at=now) for due in submit]
    after = row.model_copy(
        update={
            "next_due": next_due,
            "waiting": tuple(waiting),
            "submitting": tuple(sorted(decided, key=lambda run: run.due)),
            "last_due": fresh[-1] if fresh else row.last_due,
            "runs": row.runs + len(fresh),
            "skipped": row.skipped + len(skipped),
        }
    )
    changed = after != row
    if changed:
        after = after.model_copy(update={"updated_at": now})
    return ScheduleCheck(row=after, submit=tuple(submit), skipped=tuple(skipped), changed=changed)


def submitted(row: Schedule, dues: Sequence[int], *, now: float) -> Schedule:
    """The row once the runs due at ``dues`` are in the store: they are no longer decided."""
    kept = tuple(run for run in row.submitting if run.due not in dues)
    if kept == row.submitting:
        return row
    return row.model_copy(update={"submitting": kept, "updated_at": now})


def paused(row: Schedule, *, now: float) -> Schedule:
    """The schedule paused (as it is when it was already)."""
    if row.state is ScheduleState.PAUSED:
        return row
    return row.model_copy(update={"state": ScheduleState.PAUSED, "updated_at": now})


def resumed(row: Schedule, *, now: float) -> Schedule:
    """The schedule active again, due next at the first due time after ``now``.

    The due times that passed while it was paused are not run. An active schedule is
    left as it is.
    """
    if row.state is ScheduleState.ACTIVE:
        return row
    return row.model_copy(
        update={
            "state": ScheduleState.ACTIVE,
            "next_due": next_due_after(row.timing, now),
            "updated_at": now,
        }
    )
