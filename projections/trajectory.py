"""The trajectory read model: the fold's trajectories stored as rows, and read back.

:class:`TrajectoryProjection` applies :func:`evolve_trajectory` (the pure fold, in
:mod:`projections.trajectory_fold`, importable from here) one batch of events at a
time and stores the result as rows (what ``loop-actors show`` reads);
:func:`list_invocations` and :func:`load_trajectory` read them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, cast, get_args

from pydantic import BaseModel, JsonValue
from pydantic_core import SchemaSerializer, from_json

from aggregates.decisions import (
    DECISION_ADAPTER,
    Decision,
    Effect,
    Frozen,
    Rejection,
    TerminalReason,
)
from aggregates.digest import canonical_json
from aggregates.effect import EffectEvent
from aggregates.events import ByClass, DomainEvent
from aggregates.invocation import (
    BatchDispatched,
    InvocationEvent,
    InvocationStarted,
)
from projections.runner import ReadModel, ReadModelRunner
from projections.sql import ViewCursor, marks
from projections.trajectory_fold import (
    ENUM_VALUES,
    CallView,
    CritiqueView,
    InvocationStatus,
    StepView,
    Trajectory,
    build_trajectory,
    evolve_trajectory,
    step_changed_by,
)

__all__ = [
    # The fold's names, importable from here as before they moved.
    "CallView",
    "CritiqueView",
    "InvocationStatus",
    "StepView",
    "Trajectory",
    "TrajectoryProjection",
    "build_trajectory",
    "evolve_trajectory",
    "list_invocations",
    "load_trajectory",
    "step_changed_by",
]

# --------------------------------------------------------------------------- the read model

Query = Callable[[str, Sequence[Any]], list[dict[str, Any]]]
"""Runs a SELECT and returns its rows as dicts (a cursor in a batch, or a runner)."""


class TrajectoryProjection(ReadModel):
    """Per invocation: its steps, each call with its status, and how it ended.

    Every event goes through :func:`evolve_trajectory`, a batch at a time: the
    projection folds each touched invocation's events into its trajectory in
    memory, in the batch's order, and writes each changed row once (one
    ``executemany`` per statement). The trajectories it folded stay in the
    runner's cache (``cursor.cache``) for the next batch, up to
    ``CACHE_STEPS`` steps in all (least recently touched dropped first); one
    that is not there is read whole from its rows first. The rows hold nothing
    the fold did not produce, except ``started_position`` (where the invocation
    starts in the store, for ``list``'s order).
    """

    name = "trajectory"
    version = 9

    CACHE_STEPS: ClassVar[int] = 20_000
    """How many trajectories' steps (plus one per trajectory) the cache may hold."""

    def create(self) -> list[str]:
        """The tables."""
        return [
            "CREATE TABLE IF NOT EXISTS trajectory_invocations ("
            "invocation_id TEXT PRIMARY KEY, agent TEXT, agent_version TEXT, task_class TEXT, "
            "goal TEXT, status TEXT, reason TEXT, answer TEXT, detail TEXT, steps BIGINT, "
            "tool_calls BIGINT, input_tokens BIGINT, output_tokens BIGINT, "
            "cost DOUBLE PRECISION, started_at TEXT, ended_at TEXT, started_position BIGINT, "
            "events BIGINT, parent_id TEXT, forked_from TEXT, handed_off_from TEXT)",
            "CREATE INDEX IF NOT EXISTS trajectory_invocations_parent "
            "ON trajectory_invocations (parent_id)",
            "CREATE INDEX IF NOT EXISTS trajectory_invocations_order "
            "ON trajectory_invocations (started_position)",
            "CREATE TABLE IF NOT EXISTS trajectory_steps ("
            "invocation_id TEXT, step BIGINT, kind TEXT, summary TEXT, decision TEXT, "
            "rejection TEXT, input_tokens BIGINT, output_tokens BIGINT, cost DOUBLE PRECISION, "
            "latency_ms DOUBLE PRECISION, approval TEXT, PRIMARY KEY (invocation_id, step))",
            "CREATE TABLE IF NOT EXISTS trajectory_calls ("
            "invocation_id TEXT, step BIGINT, call_order BIGINT, call_id TEXT, tool TEXT, "
            "arguments TEXT, effect TEXT, effect_key TEXT, status TEXT, error_class TEXT, "
            "error_message TEXT, output TEXT, duration_ms DOUBLE PRECISION, effect_status TEXT, "
            "plan_step BIGINT, PRIMARY KEY (invocation_id, step, call_id))",
            "CREATE INDEX IF NOT EXISTS trajectory_calls_effect ON trajectory_calls (effect_key)",
            "CREATE TABLE IF NOT EXISTS trajectory_critiques ("
            "invocation_id TEXT, round BIGINT, step BIGINT, verdict TEXT, critique TEXT, "
            "problem TEXT, input_tokens BIGINT, output_tokens BIGINT, cost DOUBLE PRECISION, "
            "latency_ms DOUBLE PRECISION, PRIMARY KEY (invocation_id, round))",
        ]

    def tables(self) -> list[str]:
        """The tables, for a rebuild."""
        return [
            "trajectory_invocations",
            "trajectory_steps",
            "trajectory_calls",
            "trajectory_critiques",
        ]

    def apply(self, cursor: ViewCursor, event: DomainEvent, position: int) -> None:
        """Fold one event into the rows of its invocation (a batch of one)."""
        self.apply_batch(cursor, [(event, position)])

    def apply_batch(self, cursor: ViewCursor, events: Sequence[tuple[DomainEvent, int]]) -> None:
        """Fold a batch of events into the rows of the invocations they touch.

        Folds each touched invocation's events with :func:`evolve_trajectory`
        (starting from the cached trajectory, or the one its rows hold), and
        writes each changed row once. An event of an invocation the read model
        does not hold, or of an effect no held call names, changes nothing.
        """
        cache = _Cache.of(cursor.cache)
        routed, started, owners = _route(cursor, cache, events)
        held = cache.held
        before: dict[str, Trajectory] = {}  # in the order the batch first names them
        wanted: set[str] = set()
        for i, _ in routed:
            if i not in before:
                trajectory = held.get(i)
                if trajectory is not None:
                    before[i] = trajectory
                elif i not in started:
                    wanted.add(i)
        read = _read_whole(cursor, sorted(wanted))
        before |= read
        for stored in read.values():
            owners.update(_effect_keys(stored))
        after = dict(before)
        for invocation_id, event in routed:
            trajectory = after.get(invocation_id)
            if trajectory is None and invocation_id not in started:
                continue
            after[invocation_id] = evolve_trajectory(trajectory, event)
        rows = _Rows()
        for invocation_id, trajectory in after.items():
            rows.add(before.get(invocation_id), trajectory, started.get(invocation_id))
        rows.write(cursor)
        cache.keep(after.values(), owners, self.CACHE_STEPS)


class _Cache:
    """The trajectories a runner keeps between batches, and who owns which effect key."""

    def __init__(self) -> None:
        self.held: OrderedDict[str, Trajectory] = OrderedDict()
        """By invocation, least recently touched first (an ``OrderedDict``: dropping the
        oldest of a plain dict again and again makes each next look past the holes left)."""
        self.owners: dict[str, str] = {}
        """Effect key -> invocation, for the calls of the held trajectories."""
        self.weight = 0
        """Steps held, plus one per trajectory."""

    @classmethod
    def of(cls, memory: dict[str, Any]) -> _Cache:
        """The cache in the runner's memory for this read model (made when empty)."""
        cache = memory.get("trajectories")
        if not isinstance(cache, _Cache):
            cache = memory["trajectories"] = cls()
        return cache

    def keep(self, trajectories: Iterable[Trajectory], owners: dict[str, str], limit: int) -> None:
        """Hold these (now the most recently touched); drop the oldest past ``limit``.

        ``owners`` are the effect keys of the calls they hold that the cache does
        not know yet (dispatched in the batch, or read from the rows).
        """
        held, weight = self.held, self.weight
        for trajectory in trajectories:
            t = trajectory.__dict__  # (see _head_row)
            invocation_id = t["invocation_id"]
            old = held.get(invocation_id)
            held[invocation_id] = trajectory
            if old is not None:
                weight -= 1 + len(old.__dict__["steps"])
                held.move_to_end(invocation_id)
            weight += 1 + len(t["steps"])
        self.weight = weight
        self.owners.update((k, i) for k, i in owners.items() if i in self.held)
        while self.weight > limit and self.held:
            _, dropped = self.held.popitem(last=False)
            self.weight -= 1 + len(dropped.steps)
            for key, _ in _effect_keys(dropped):
                self.owners.pop(key, None)


def _effect_keys(trajectory: Trajectory) -> Iterator[tuple[str, str]]:
    """(effect key, invocation) for each write the trajectory holds."""
    t = trajectory.__dict__  # (see _head_row)
    for step in t["steps"]:
        for call in step.__dict__["calls"]:
            key = call.__dict__["effect_key"]
            if key:
                yield key, t["invocation_id"]


def _route(
    cursor: ViewCursor, cache: _Cache, events: Sequence[tuple[DomainEvent, int]]
) -> tuple[list[tuple[str, DomainEvent]], dict[str, int], dict[str, str]]:
    """Route a batch: each event with the invocation it folds into.

    Returns the events in order with their invocations, where the invocations
    that start in the batch start, and the invocation of each write dispatched
    in the batch.
    """
    routed: list[tuple[str, DomainEvent]] = []
    started: dict[str, int] = {}
    owners: dict[str, str] = {}  # effect key -> invocation, for writes dispatched in the batch
    unknown: list[tuple[int, DomainEvent]] = []  # (index in routed, an effect event)
    route = _ROUTES
    for event, position in events:
        kind = route[type(event)]
        if kind is _OTHER:
            continue
        if kind is _EFFECT:
            key = event.originator_id
            owner = owners.get(key) or cache.owners.get(key)
            if owner is None:
                unknown.append((len(routed), event))
            routed.append((owner or "", event))
            continue
        invocation_id = event.originator_id
        routed.append((invocation_id, event))
        if kind is _STARTED:
            started.setdefault(invocation_id, position)
        elif kind is _DISPATCHED:
            calls = cast("BatchDispatched", event).calls
            owners.update((c.effect_key, invocation_id) for c in calls if c.effect_key)
    if not unknown:
        return routed, started, owners  # every event has its invocation
    stored = _stored_owners(cursor, [event.originator_id for _, event in unknown])
    for index, event in unknown:
        routed[index] = (stored.get(event.originator_id, ""), event)
    return [(i, event) for i, event in routed if i], started, owners


_OTHER, _EFFECT, _INVOCATION, _STARTED, _DISPATCHED = (
    "other",
    "effect",
    "invocation",
    "start",
    "batch",
)


def _route_of(cls: type) -> str:
    """How ``_route`` takes an event of ``cls``."""
    if issubclass(cls, EffectEvent):
        return _EFFECT
    if not issubclass(cls, InvocationEvent):
        return _OTHER
    if issubclass(cls, InvocationStarted):
        return _STARTED
    return _DISPATCHED if issubclass(cls, BatchDispatched) else _INVOCATION


_ROUTES: ByClass[str] = ByClass(_route_of)


_CHUNK = 250
"""Keys per SELECT: at most 250 bound parameters."""


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    return (items[i : i + _CHUNK] for i in range(0, len(items), _CHUNK))


def _stored_owners(cursor: ViewCursor, keys: Sequence[str]) -> dict[str, str]:
    """For effect keys held by stored calls: the invocation of the call."""
    found: dict[str, str] = {}
    for chunk in _chunks(sorted(set(keys))):
        for row in cursor.query(
            "SELECT effect_key, invocation_id FROM trajectory_calls "
            f"WHERE effect_key IN ({marks(len(chunk))})",
            chunk,
        ):
            found.setdefault(row["effect_key"], row["invocation_id"])
    return found


def _read_whole(cursor: ViewCursor, invocation_ids: Sequence[str]) -> dict[str, Trajectory]:
    """The stored trajectories of these invocations (those the read model holds)."""
    found: dict[str, Trajectory] = {}
    for chunk in _chunks(invocation_ids):
        where = f"WHERE invocation_id IN ({marks(len(chunk))})"
        heads = cursor.query(f"SELECT * FROM trajectory_invocations {where}", chunk)
        steps: dict[str, list[dict[str, Any]]] = {}
        for row in cursor.query(f"SELECT * FROM trajectory_steps {where} ORDER BY step", chunk):
            steps.setdefault(row["invocation_id"], []).append(row)
        calls: dict[str, list[dict[str, Any]]] = {}
        for row in cursor.query(
            f"SELECT * FROM trajectory_calls {where} ORDER BY step, call_order", chunk
        ):
            calls.setdefault(row["invocation_id"], []).append(row)
        critiques: dict[str, list[dict[str, Any]]] = {}
        for row in cursor.query(
            f"SELECT * FROM trajectory_critiques {where} ORDER BY round", chunk
        ):
            critiques.setdefault(row["invocation_id"], []).append(row)
        for head in heads:
            i = head["invocation_id"]
            found[i] = _from_rows(head, steps.get(i, []), calls.get(i, []), critiques.get(i, []))
    return found


def _head_row(trajectory: Trajectory, *, started_position: int | None = None) -> tuple[Any, ...]:
    # The row builders read a model's fields from its __dict__: each attribute of a pydantic
    # model is read through BaseModel.__getattr__'s hook, twice as slow (every row, every batch).
    t = trajectory.__dict__
    steps, reason = t["steps"], t["reason"]
    return (
        t["invocation_id"],
        t["agent_name"],
        t["agent_version"],
        t["task_class"],
        t["goal"],
        ENUM_VALUES[t["status"]],
        ENUM_VALUES[reason] if reason else None,
        t["answer"],
        t["detail"],
        steps[-1].step if steps else 0,
        t["tool_calls"],
        t["input_tokens"],
        t["output_tokens"],
        t["cost"],
        t["started_at"],
        t["ended_at"],
        started_position,
        t["events"],
        t["parent_id"],
        t["forked_from"],
        t["handed_off_from"],
    )


def _step_row(invocation_id: str, step: StepView) -> tuple[Any, ...]:
    s = step.__dict__
    decision, rejection = s["decision"], s["rejection"]
    return (
        invocation_id,
        s["step"],
        s["kind"],
        s["summary"],
        _json(_decision_json(decision) if decision else None),
        _json(_REJECTION.to_python(rejection, mode="json") if rejection else None),
        s["input_tokens"],
        s["output_tokens"],
        s["cost"],
        s["latency_ms"],
        s["approval"],
    )


def _serializer_of(cls: type[BaseModel]) -> SchemaSerializer:
    """The class's own serializer, built now if its build was deferred to its first use.

    Kept in a table, it must be the real one: a deferred class's placeholder rebuilds
    (or checks that it is built) on every call.
    """
    cls.model_rebuild()
    return cls.__pydantic_serializer__


_DECISION_SERIALIZERS = {cls: _serializer_of(cls) for cls in get_args(get_args(Decision)[0])}
"""Each decision class's own serializer: for a decision of exactly that class it writes what
``DECISION_ADAPTER`` writes (the union's serializer picks that class's), without choosing."""


_REJECTION = _serializer_of(Rejection)
"""``rejection.model_dump(mode="json")``, without its Python wrapper."""


def _decision_json(decision: Decision) -> Any:
    """``DECISION_ADAPTER.dump_python(decision, mode="json")``."""
    serializer = _DECISION_SERIALIZERS.get(type(decision))
    if serializer is None:  # a subclass: the union's own choice
        return DECISION_ADAPTER.dump_python(decision, mode="json")
    return serializer.to_python(decision, mode="json")


def _call_row(invocation_id: str, step: int, order: int, call: CallView) -> tuple[Any, ...]:
    c = call.__dict__
    return (
        invocation_id,
        step,
        order,
        c["call_id"],
        c["name"],
        _json(c["arguments"]),
        ENUM_VALUES[c["effect"]],
        c["effect_key"],
        *_result_columns(call),
        c["plan_step"],
    )


def _result_columns(call: CallView) -> tuple[Any, ...]:
    """status, error_class, error_message, output, duration_ms, effect_status."""
    c = call.__dict__
    status = c["status"]
    failed = status not in ("ok", "dispatched")
    return (
        "error" if failed else status,
        status if failed else None,
        c["error_message"],
        _json(c["output"]) if status == "ok" else None,
        c["duration_ms"],
        c["effect_status"],
    )


_STEP_COLUMNS = tuple(name for name in StepView.model_fields if name != "calls")
_CALL_DISPATCHED = ("call_id", "name", "arguments", "effect", "effect_key", "plan_step")
"""What a call's row holds from ``BatchDispatched``: it never changes after."""
_CALL_SETTLED = ("status", "output", "error_message", "duration_ms")
"""What ``ResultsCommitted`` sets (and ``effect_status``, which effect events change too)."""


def _same_fields(old: Frozen, new: Frozen, names: Sequence[str]) -> bool:
    """Whether the fields ``names`` hold the same values.

    Mostly the same objects (the fold keeps what it does not change), and pydantic's
    ``==`` does not look at identity first.
    """
    before, after = old.__dict__, new.__dict__
    for name in names:
        value, other = before[name], after[name]
        if value is not other and value != other:
            return False
    return True


class _Rows:
    """The rows a batch changed, each once, written with one ``executemany`` per statement."""

    def __init__(self) -> None:
        self.started: list[tuple[Any, ...]] = []
        self.heads: list[tuple[Any, ...]] = []
        self.changed_heads: list[tuple[Any, ...]] = []
        self.steps: list[tuple[Any, ...]] = []
        self.calls: list[tuple[Any, ...]] = []
        self.effect_statuses: list[tuple[Any, ...]] = []
        self.results: list[tuple[Any, ...]] = []
        self.changed_steps: list[tuple[Any, ...]] = []
        self.changed_calls: list[tuple[Any, ...]] = []
        self.critiques: list[tuple[Any, ...]] = []

    def add(self, before: Trajectory | None, after: Trajectory, started: int | None) -> None:
        """The rows that differ between ``before`` (None for a new one) and ``after``."""
        if after is before:
            return  # the batch's events changed nothing here
        # The models' fields are read from their __dict__s (see _head_row).
        a = after.__dict__
        invocation_id = a["invocation_id"]
        head = _head_row(after, started_position=started)
        if before is None:
            self.started.append(head)
            old_steps = []
        else:
            old_steps = before.__dict__["steps"]
            if head[17] != before.__dict__["events"] or head != _head_row(before):  # its events
                if _same_fields(before, after, _HEAD_FIXED):  # what only its start sets: kept
                    self.heads.append((*head[5:14], head[15], head[17], invocation_id))
                else:  # not done by today's fold
                    self.changed_heads.append((*head[1:16], *head[17:], invocation_id))
        # The critic's rounds are only ever appended.
        critiques = a["critiques"]
        known = len(before.__dict__["critiques"]) if before is not None else 0
        self.critiques.extend(_critique_row(invocation_id, c) for c in critiques[known:])
        # The fold keeps the steps it does not change, in place, and appends new ones.
        held = len(old_steps)
        for index, step in enumerate(a["steps"]):
            old = old_steps[index] if index < held else None
            if old is step:
                continue
            s = step.__dict__
            number = s["step"]
            if old is None:
                self.steps.append(_step_row(invocation_id, step))
                for order, call in enumerate(s["calls"]):
                    self.calls.append(_call_row(invocation_id, number, order, call))
                continue
            if not _same_fields(old, step, _STEP_COLUMNS):  # not done by today's fold
                self.changed_steps.append(_step_row(invocation_id, step))
            old_calls = {call.__dict__["call_id"]: call for call in old.__dict__["calls"]}
            for order, call in enumerate(s["calls"]):
                c = call.__dict__
                was = old_calls.get(c["call_id"])
                if was is None:
                    self.calls.append(_call_row(invocation_id, number, order, call))
                elif was is call or was.__dict__ == c:  # CallView's ==, less slowly
                    continue
                elif not _same_fields(was, call, _CALL_DISPATCHED):  # not done by the fold
                    self.changed_calls.append(_call_row(invocation_id, number, order, call))
                elif _same_fields(was, call, _CALL_SETTLED):  # only the ledger moved
                    self.effect_statuses.append(
                        (c["effect_status"], invocation_id, number, c["call_id"])
                    )
                else:  # its result came: the dispatched columns stay
                    self.results.append(
                        (*_result_columns(call), invocation_id, number, c["call_id"])
                    )

    def write(self, cursor: ViewCursor) -> None:
        """Write them: new rows are INSERTs (a second runner's start fails the batch).

        The rows the fold changed exist (the batch read or cached them): UPDATEs of
        the columns that changed.
        """
        cursor.insert_rows("trajectory_invocations", _HEAD_TABLE, self.started)
        cursor.update_rows("trajectory_invocations", _HEAD_MOVES, ("invocation_id",), self.heads)
        cursor.update_rows(
            "trajectory_invocations", _HEAD_UPDATE, ("invocation_id",), self.changed_heads
        )
        cursor.insert_rows("trajectory_steps", _STEP_TABLE, self.steps)
        cursor.insert_rows("trajectory_steps", _STEP_TABLE, self.changed_steps, key=_STEP_KEY)
        cursor.insert_rows("trajectory_calls", _CALL_TABLE, self.calls)
        cursor.insert_rows("trajectory_calls", _CALL_TABLE, self.changed_calls, key=_CALL_KEY)
        cursor.update_rows("trajectory_calls", _CALL_RESULT, _CALL_KEY, self.results)
        cursor.update_rows("trajectory_calls", ("effect_status",), _CALL_KEY, self.effect_statuses)
        cursor.insert_rows("trajectory_critiques", _CRITIQUE_TABLE, self.critiques)


_HEAD_TABLE = (
    "invocation_id", "agent", "agent_version", "task_class", "goal", "status", "reason",
    "answer", "detail", "steps", "tool_calls", "input_tokens", "output_tokens", "cost",
    "started_at", "ended_at", "started_position", "events", "parent_id", "forked_from",
    "handed_off_from",
)  # fmt: skip
_HEAD_UPDATE = tuple(c for c in _HEAD_TABLE if c not in ("invocation_id", "started_position"))
_HEAD_FIXED = (
    "agent_name", "agent_version", "task_class", "goal", "started_at", "parent_id", "forked_from",
    "handed_off_from",
)  # fmt: skip
"""The fields of the head that only ``InvocationStarted`` sets."""
_HEAD_MOVES = (*_HEAD_TABLE[5:14], _HEAD_TABLE[15], _HEAD_TABLE[17])
"""The head's columns that the events after the start change: status ... cost, ended_at, events."""
_STEP_KEY = ("invocation_id", "step")
_CALL_KEY = ("invocation_id", "step", "call_id")
_CALL_RESULT = (
    "status", "error_class", "error_message", "output", "duration_ms", "effect_status",
)  # fmt: skip
_STEP_TABLE = (
    "invocation_id",
    "step",
    "kind",
    "summary",
    "decision",
    "rejection",
    "input_tokens",
    "output_tokens",
    "cost",
    "latency_ms",
    "approval",
)
_CRITIQUE_COLUMNS = tuple(CritiqueView.model_fields)
"""The columns of ``trajectory_critiques`` after ``invocation_id``: the view's fields."""
_CRITIQUE_TABLE = ("invocation_id", *_CRITIQUE_COLUMNS)


def _critique_row(invocation_id: str, critique: CritiqueView) -> tuple[Any, ...]:
    c = critique.__dict__
    return (invocation_id, *(c[name] for name in _CRITIQUE_COLUMNS))


_CALL_TABLE = (
    "invocation_id",
    "step",
    "call_order",
    "call_id",
    "tool",
    "arguments",
    "effect",
    "effect_key",
    "status",
    "error_class",
    "error_message",
    "output",
    "duration_ms",
    "effect_status",
    "plan_step",
)


def _read(query: Query, invocation_id: str) -> Trajectory | None:
    """An invocation's whole trajectory from its rows (None if unknown)."""
    rows = query("SELECT * FROM trajectory_invocations WHERE invocation_id = ?", [invocation_id])
    if not rows:
        return None
    steps = query(
        "SELECT * FROM trajectory_steps WHERE invocation_id = ? ORDER BY step", [invocation_id]
    )
    calls = query(
        "SELECT * FROM trajectory_calls WHERE invocation_id = ? ORDER BY step, call_order",
        [invocation_id],
    )
    critiques = query(
        "SELECT * FROM trajectory_critiques WHERE invocation_id = ? ORDER BY round",
        [invocation_id],
    )
    return _from_rows(rows[0], steps, calls, critiques)


def _from_rows(
    head: dict[str, Any],
    step_rows: list[dict[str, Any]],
    calls: list[dict[str, Any]],
    critiques: list[dict[str, Any]],
) -> Trajectory:
    """A trajectory from its head row, some of its step rows and their calls (in order)."""
    by_step: dict[int, list[CallView]] = {}
    for call in calls:
        by_step.setdefault(call["step"], []).append(
            CallView(
                call_id=call["call_id"],
                name=call["tool"],
                arguments=from_json(call["arguments"]),
                status=call["error_class"] or call["status"],
                output=_loads(call["output"]),
                error_message=call["error_message"],
                duration_ms=call["duration_ms"],
                effect=Effect(call["effect"]),
                effect_key=call["effect_key"],
                effect_status=call["effect_status"],
                plan_step=call["plan_step"],
            )
        )
    return Trajectory(
        invocation_id=head["invocation_id"],
        goal=head["goal"],
        agent_name=head["agent"],
        agent_version=head["agent_version"],
        parent_id=head["parent_id"],
        forked_from=head["forked_from"],
        handed_off_from=head["handed_off_from"],
        steps=[
            StepView(
                step=s["step"],
                kind=s["kind"],
                summary=s["summary"],
                calls=by_step.get(s["step"], []),
                input_tokens=s["input_tokens"],
                output_tokens=s["output_tokens"],
                cost=s["cost"],
                latency_ms=s["latency_ms"],
                decision=DECISION_ADAPTER.validate_json(s["decision"]) if s["decision"] else None,
                rejection=Rejection.model_validate_json(s["rejection"]) if s["rejection"] else None,
                approval=s["approval"],
            )
            for s in step_rows
        ],
        reason=TerminalReason(head["reason"]) if head["reason"] else None,
        answer=head["answer"],
        detail=head["detail"],
        tool_calls=head["tool_calls"],
        events=head["events"],
        status=InvocationStatus(head["status"]),
        task_class=head["task_class"],
        started_at=head["started_at"],
        ended_at=head["ended_at"],
        input_tokens=head["input_tokens"],
        output_tokens=head["output_tokens"],
        cost=head["cost"],
        critiques=[
            CritiqueView(**{name: row[name] for name in _CRITIQUE_COLUMNS}) for row in critiques
        ],
    )


def _json(value: Any) -> str | None:
    return None if value is None else canonical_json(value)


def _loads(text: str | None) -> JsonValue:
    return None if text is None else from_json(text)


def list_invocations(
    runner: ReadModelRunner,
    *,
    reason: str | None = None,
    agent: str | None = None,
    limit: int = 100,
    roots_only: bool = False,
    parent_id: str | None = None,
    forked_from: str | None = None,
    originals_only: bool = False,
    status: InvocationStatus | None = None,
    offset: int = 0,
    id_prefix: str | None = None,
    started_from: str | None = None,
    started_before: str | None = None,
) -> list[dict[str, Any]]:
    """Invocations from the trajectory read model, newest first, optionally filtered.

    ``roots_only``: no child invocation; ``parent_id``: the children of that one;
    ``forked_from``: the forks of that one; ``originals_only``: no fork; ``status``:
    running, paused or terminated. ``offset``: skip that many of the newest (a page).
    ``id_prefix``: ids that start with it; ``started_from`` / ``started_before``: started
    at or after / before that ISO 8601 time (or date), compared as the stored UTC text.
    """
    clauses: list[str] = []
    params: list[Any] = []
    if status is not None:
        clauses.append("status = ?")
        params.append(status.value)
    if id_prefix:
        escaped = id_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        clauses.append("invocation_id LIKE ? ESCAPE '\\'")
        params.append(f"{escaped}%")
    if started_from is not None:
        clauses.append("started_at >= ?")
        params.append(started_from)
    if started_before is not None:
        clauses.append("started_at < ?")
        params.append(started_before)
    if roots_only:
        clauses.append("parent_id IS NULL")
    if parent_id is not None:
        clauses.append("parent_id = ?")
        params.append(parent_id)
    if forked_from is not None:
        clauses.append("forked_from = ?")
        params.append(forked_from)
    if originals_only:
        clauses.append("forked_from IS NULL")
    if reason is not None:
        clauses.append("reason = ?")
        params.append(reason)
    if agent is not None:
        clauses.append("agent = ?")
        params.append(agent)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return runner.query(
        "SELECT invocation_id, agent, task_class, status, reason, steps, tool_calls, "
        "started_at, ended_at, goal, parent_id, forked_from, handed_off_from "
        f"FROM trajectory_invocations {where} "
        "ORDER BY started_position DESC LIMIT ? OFFSET ?",
        [*params, limit, offset],
    )


def invocation_summary(runner: ReadModelRunner) -> list[dict[str, Any]]:
    """How many invocations each agent has in each status: rows of agent, status, count."""
    return runner.query(
        "SELECT agent, status, COUNT(*) AS count FROM trajectory_invocations "
        "GROUP BY agent, status ORDER BY agent, status"
    )


def load_trajectory(runner: ReadModelRunner, invocation_id: str) -> Trajectory | None:
    """An invocation's trajectory as the read model holds it (None if unknown)."""
    return _read(runner.query, invocation_id)
