"""The trajectory of one invocation: its steps, calls, results and how it ended.

One fold, :func:`evolve_trajectory`, turns an invocation's events (and the
events of its writes' effects) into a :class:`Trajectory`. Everything that shows
a trajectory goes through it: :func:`build_trajectory` folds a whole history (what
``loop-actors demo`` prints), and :class:`TrajectoryProjection` applies it one
event at a time and stores the result as rows (what ``loop-actors show`` reads).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import StrEnum
from typing import Any, ClassVar, TypeVar, cast, get_args

from pydantic import JsonValue
from pydantic_core import from_json

from aggregates.decisions import (
    DECISION_ADAPTER,
    SET_DICT,
    SET_EXTRA,
    SET_FIELDS_SET,
    SET_PRIVATE,
    Decision,
    Effect,
    EffectStatus,
    ErrorClass,
    Frozen,
    Rejection,
    TerminalReason,
    ToolResult,
    built,
)
from aggregates.digest import canonical_json
from aggregates.effect import EffectEvent, effect_status_after
from aggregates.events import ByClass, DomainEvent, isoformat
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    ClarificationProvided,
    ContextCompacted,
    DecisionProposed,
    InvocationEvent,
    InvocationStarted,
    Paused,
    ResultsCommitted,
    Terminated,
    VerificationFailed,
)
from aggregates.values import limit_size
from projections.runner import Projection, ProjectionRunner
from projections.sql import ViewCursor, marks

_Model = TypeVar("_Model", bound=Frozen)


class InvocationStatus(StrEnum):
    """Where an invocation stands: running, paused (for a person or a service) or over."""

    RUNNING = "running"
    PAUSED = "paused"
    TERMINATED = "terminated"


class CallView(Frozen):
    """One call of a step and what became of it."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    status: str
    """``ok``, an error class, or ``dispatched`` while no result is committed."""
    output: JsonValue = None
    """The output, or, over ``OUTPUT_PREVIEW_BYTES``, its truncated stand-in
    (``{"truncated": true, "size": ..., "sha256": ..., "head": ...}``)."""
    error_message: str | None = None
    duration_ms: float | None = None
    effect: Effect = Effect.READ
    effect_key: str | None = None
    """For a write: its effect key (the ``effects`` listing and the ledger use it)."""
    effect_status: str | None = None
    """For a write: what the effect ledger says (``committed``, ``reconciled``...)."""


class StepView(Frozen):
    """One model decision and, for a tool batch, its calls."""

    step: int
    kind: str
    """The decision kind, or ``rejected``."""
    summary: str
    calls: list[CallView] = []
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    decision: Decision | None = None
    rejection: Rejection | None = None


class Trajectory(Frozen):
    """The readable history of one invocation."""

    invocation_id: str
    goal: str
    agent_name: str
    agent_version: str = ""
    steps: list[StepView]
    reason: TerminalReason | None = None
    answer: str | None = None
    detail: str | None = None
    tool_calls: int = 0
    events: int = 0
    """The invocation's events folded so far (its version)."""
    status: InvocationStatus = InvocationStatus.RUNNING
    task_class: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    """When it last paused or ended; None while running."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0


def _summary(decision: Decision | None, rejection: Rejection | None) -> tuple[str, str]:
    """A step's kind and summary, from its decision or its rejection."""
    if rejection is not None:
        return "rejected", "; ".join(rejection.__dict__["problems"])
    assert decision is not None
    d = decision.__dict__  # the fields (see _head_row)
    match kind := d["kind"]:
        case "final":
            return "final", d["answer"]
        case "tool_calls":
            return "tool_calls", f"{len(d['calls'])} call(s)"
        case "clarification":
            return "clarification", d["question"]
        case "request_approval":
            return "request_approval", d["proposal_digest"]
        case "cannot_continue":
            return "cannot_continue", d["reason"]
    return kind, ""


# --------------------------------------------------------------------------- the fold


def evolve_trajectory(trajectory: Trajectory | None, event: DomainEvent) -> Trajectory:
    """The trajectory after one more event: the one fold behind every trajectory shown.

    Pure. ``trajectory`` is None before the invocation's ``InvocationStarted``.
    Each event changes the trajectory's head and at most one step: the step it
    names, or for an effect event the step holding the call with its effect key.
    An effect event of a write this trajectory does not hold (yet) changes nothing,
    and so does any event that is not the invocation's or its effects'.

    Raises:
        ValueError: the events do not start with ``InvocationStarted``, or name a
            step the trajectory does not hold.
    """
    if trajectory is None:
        if not isinstance(event, InvocationStarted):
            raise ValueError("a trajectory starts with InvocationStarted")
        return built(
            Trajectory,
            {
                "invocation_id": event.originator_id,
                "goal": event.goal,
                "agent_name": event.agent_name,
                "agent_version": event.agent_version,
                "steps": [],
                "reason": None,
                "answer": None,
                "detail": None,
                "tool_calls": 0,
                "events": event.originator_version,
                "status": InvocationStatus.RUNNING,
                "task_class": event.task_class,
                "started_at": isoformat(event.timestamp),
                "ended_at": None,
                "input_tokens": 0,
                "output_tokens": 0,
                "cost": 0.0,
            },
        )
    cls = type(event)
    fold = _INVOCATION_FOLDS[cls]
    if fold is None:  # not an invocation event
        return _on_effect(trajectory, event) if _IS_EFFECT[cls] else trajectory
    # The folds read the models' fields from their __dict__s (see _head_row): the event's
    # fields are handed to them as its __dict__.
    e = event.__dict__
    if e["originator_id"] != trajectory.__dict__["invocation_id"]:
        return trajectory
    head: dict[str, Any] = {"events": e["originator_version"]}
    fold(trajectory, e, head)
    return _replace(trajectory, head)


_Fold = Callable[[Trajectory, dict[str, Any], dict[str, Any]], None]
"""What an invocation event (its fields: its ``__dict__``) changes: it puts the head's new
values in the dict it is given."""


def _on_decision(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    decision, rejection = event["decision"], event["rejection"]
    kind, summary = _summary(decision, rejection)
    usage = event["usage"].__dict__  # read once each (see _head_row)
    input_tokens, output_tokens, cost = usage["input_tokens"], usage["output_tokens"], usage["cost"]
    step = built(
        StepView,
        {
            "step": event["step"],
            "kind": kind,
            "summary": summary,
            "calls": [],
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cost": cost,
            "latency_ms": usage["latency_ms"],
            "decision": decision,
            "rejection": rejection,
        },
    )
    t = trajectory.__dict__
    head["steps"] = [*t["steps"], step]
    head["input_tokens"] = t["input_tokens"] + input_tokens
    head["output_tokens"] = t["output_tokens"] + output_tokens
    head["cost"] = t["cost"] + cost


def _on_dispatch(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    """A ``BatchDispatched``: its calls, dispatched, in the step."""
    calls = []
    for call in event["calls"]:
        c = call.__dict__
        key = c["effect_key"]
        calls.append(
            built(
                CallView,
                {
                    "call_id": c["call_id"],
                    "name": c["name"],
                    "arguments": c["arguments"],
                    "status": "dispatched",
                    "output": None,
                    "error_message": None,
                    "duration_ms": None,
                    "effect": c["effect"],
                    "effect_key": key,
                    "effect_status": "dispatched" if key else None,
                },
            )
        )
    t = trajectory.__dict__
    index = _step_index(trajectory, event["step"])
    head["steps"] = _with_step(trajectory, index, _calls(t["steps"][index], calls))
    head["tool_calls"] = t["tool_calls"] + len(calls)


def _on_results(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    """A ``ResultsCommitted``: each call of the step with its result."""
    by_id = {result.__dict__["call_id"]: result for result in event["results"]}
    t = trajectory.__dict__
    index = _step_index(trajectory, event["step"])
    step = t["steps"][index]
    calls = [_settle(call, by_id.get(call.__dict__["call_id"])) for call in step.__dict__["calls"]]
    head["steps"] = _with_step(trajectory, index, _calls(step, calls))
    if t["status"] is InvocationStatus.PAUSED:  # after a reconciliation pause
        head |= _RUNNING


def _on_pause(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    head |= {
        "status": InvocationStatus.PAUSED,
        "reason": event["reason"],
        "detail": event["question"] or event["proposal_digest"],
        "ended_at": isoformat(event["timestamp"]),
    }


def _on_end(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    head |= {
        "status": InvocationStatus.TERMINATED,
        "reason": event["reason"],
        "answer": event["answer"],
        "detail": event["detail"],
        "ended_at": isoformat(event["timestamp"]),
    }


def _on_resume(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    head |= _RUNNING


def _on_second_start(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    raise ValueError(f"invocation {trajectory.invocation_id} started twice")


def _counted(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    """Not shown in the trajectory (or not known to this version): counted among its events."""


_FOLDS: tuple[tuple[type, _Fold], ...] = (
    # The classes are disjoint; the order is the one a match over them would have.
    (DecisionProposed, _on_decision),
    (BatchDispatched, _on_dispatch),
    (ResultsCommitted, _on_results),
    (Paused, _on_pause),
    (Terminated, _on_end),
    (ApprovalGranted, _on_resume),
    (ApprovalDenied, _on_resume),
    (ClarificationProvided, _on_resume),
    (InvocationStarted, _on_second_start),
    (VerificationFailed, _counted),
    (ContextCompacted, _counted),
)


def _fold_of(cls: type) -> _Fold | None:
    """How an invocation event of ``cls`` changes a trajectory; None for any other event."""
    if not issubclass(cls, InvocationEvent):
        return None
    return next((fold for case, fold in _FOLDS if issubclass(cls, case)), _counted)


_INVOCATION_FOLDS: ByClass[_Fold | None] = ByClass(_fold_of)
_IS_EFFECT: ByClass[bool] = ByClass(lambda cls: issubclass(cls, EffectEvent))


OUTPUT_PREVIEW_BYTES = 4_096
"""The largest output (JSON bytes) the read model copies whole; a larger one is kept as its
truncated stand-in (``aggregates.values.truncated``: size, digest and the first characters)."""


def _preview(output: JsonValue) -> JsonValue:
    """What the read model copies of a stored output: all of it, or a preview and its size."""
    kept, _ = limit_size(output, max_bytes=OUTPUT_PREVIEW_BYTES)
    return cast("JsonValue", kept)


_RUNNING: dict[str, Any] = {
    "status": InvocationStatus.RUNNING,
    "reason": None,
    "detail": None,
    "ended_at": None,
}


def _replace(model: _Model, update: dict[str, Any]) -> _Model:
    """``model.model_copy(update=update)`` without its generic copying: the fold's hot path.

    As ``model_copy``, the values in ``update`` are not validated: the fold takes
    them from validated events.
    """
    copied = object.__new__(type(model))
    SET_DICT(copied, {**model.__dict__, **update})
    fields_set = model.__pydantic_fields_set__
    if not fields_set.issuperset(update):  # else shared: nothing changes a frozen model's
        fields_set = fields_set | update.keys()
    SET_FIELDS_SET(copied, fields_set)
    SET_EXTRA(copied, None)
    SET_PRIVATE(copied, None)
    return copied


def _settle(call: CallView, result: ToolResult | None) -> CallView:
    """The call with its result (as it was without one)."""
    if result is None:
        return call
    r = result.__dict__
    error, effect_status = r["error"], r["effect_status"]
    failure = error.__dict__ if error is not None else None
    return _replace(
        call,
        {
            "status": "ok" if failure is None else _VALUES[failure["error_class"]],
            "output": _preview(r["output"]) if failure is None else None,
            "error_message": failure["message"] if failure is not None else None,
            "duration_ms": r["duration_ms"],
            "effect_status": _VALUES[effect_status]
            if effect_status
            else call.__dict__["effect_status"],
        },
    )


def _calls(step: StepView, calls: list[CallView]) -> StepView:
    return _replace(step, {"calls": calls})


def _step_index(trajectory: Trajectory, number: int) -> int:
    """Where the step ``number`` is in the trajectory's steps (the first of that number)."""
    for index, step in enumerate(trajectory.__dict__["steps"]):
        if step.__dict__["step"] == number:
            return index
    raise ValueError(f"invocation {trajectory.invocation_id} has no step {number}")


def _with_step(trajectory: Trajectory, index: int, step: StepView) -> list[StepView]:
    """The trajectory's steps with ``step`` at ``index`` instead."""
    steps = list(trajectory.__dict__["steps"])
    steps[index] = step
    return steps


def _on_effect(trajectory: Trajectory, event: DomainEvent) -> Trajectory:
    """An effect event's change: the status of the call holding its effect key."""
    key = event.__dict__["originator_id"]
    steps = trajectory.__dict__["steps"]
    for holding, step in enumerate(steps):
        s = step.__dict__
        for call in s["calls"]:
            if call.__dict__["effect_key"] == key:
                break
        else:
            continue
        # The (first) step of the number of the step holding the key follows it.
        index = _step_index(trajectory, s["step"]) if holding else 0
        target = steps[index]
        status = effect_status_after(event)
        calls = [
            _replace(call, {"effect_status": status})
            if call.__dict__["effect_key"] == key
            else call
            for call in target.__dict__["calls"]
        ]
        return _replace(trajectory, {"steps": _with_step(trajectory, index, _calls(target, calls))})
    return trajectory


def step_changed_by(event: InvocationEvent) -> int | None:
    """The step already in the trajectory that ``event`` changes; None if it changes none.

    Part of the fold's contract (tests hold :func:`evolve_trajectory` to it): an
    invocation event changes the head, this step, and may append a new step,
    nothing else. An effect event changes the step holding its effect key.
    """
    match event:
        case BatchDispatched() | ResultsCommitted():
            return event.step
        case _:
            return None


def build_trajectory(events: Iterable[DomainEvent]) -> Trajectory:
    """Fold an invocation's events into its trajectory (what ``loop-actors demo`` prints).

    ``events`` are the invocation's, in order; the events of its writes' effects
    may be interleaved (in the store's order) to follow the ledger as the read
    model does. Other invocations' events are ignored.

    Raises:
        ValueError: the events do not start with ``InvocationStarted``.
    """
    trajectory: Trajectory | None = None
    for event in events:
        trajectory = evolve_trajectory(trajectory, event)
    if trajectory is None:
        raise ValueError("a trajectory starts with InvocationStarted")
    return trajectory


# --------------------------------------------------------------------------- the read model

Query = Callable[[str, Sequence[Any]], list[dict[str, Any]]]
"""Runs a SELECT and returns its rows as dicts (a cursor in a batch, or a runner)."""


class TrajectoryProjection(Projection):
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
    version = 5

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
            "events BIGINT)",
            "CREATE INDEX IF NOT EXISTS trajectory_invocations_order "
            "ON trajectory_invocations (started_position)",
            "CREATE TABLE IF NOT EXISTS trajectory_steps ("
            "invocation_id TEXT, step BIGINT, kind TEXT, summary TEXT, decision TEXT, "
            "rejection TEXT, input_tokens BIGINT, output_tokens BIGINT, cost DOUBLE PRECISION, "
            "latency_ms DOUBLE PRECISION, PRIMARY KEY (invocation_id, step))",
            "CREATE TABLE IF NOT EXISTS trajectory_calls ("
            "invocation_id TEXT, step BIGINT, call_order BIGINT, call_id TEXT, tool TEXT, "
            "arguments TEXT, effect TEXT, effect_key TEXT, status TEXT, error_class TEXT, "
            "error_message TEXT, output TEXT, duration_ms DOUBLE PRECISION, effect_status TEXT, "
            "PRIMARY KEY (invocation_id, step, call_id))",
            "CREATE INDEX IF NOT EXISTS trajectory_calls_effect ON trajectory_calls (effect_key)",
        ]

    def tables(self) -> list[str]:
        """The tables, for a rebuild."""
        return ["trajectory_invocations", "trajectory_steps", "trajectory_calls"]

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
        for head in heads:
            i = head["invocation_id"]
            found[i] = _from_rows(head, steps.get(i, []), calls.get(i, []))
    return found


_VALUES: dict[StrEnum, str] = {
    m: m.value
    for e in (InvocationStatus, TerminalReason, Effect, ErrorClass, EffectStatus)
    for m in e
}
"""Each status, reason, effect, error class and effect status's value (a dict lookup: an
enum's ``value`` is a Python property)."""


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
        _VALUES[t["status"]],
        _VALUES[reason] if reason else None,
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
    )


_DECISION_SERIALIZERS = {
    cls: cls.__pydantic_serializer__ for cls in get_args(get_args(Decision)[0])
}
"""Each decision class's own serializer: for a decision of exactly that class it writes what
``DECISION_ADAPTER`` writes (the union's serializer picks that class's), without choosing."""


_REJECTION = Rejection.__pydantic_serializer__
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
        _VALUES[c["effect"]],
        c["effect_key"],
        *_result_columns(call),
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
_CALL_DISPATCHED = ("call_id", "name", "arguments", "effect", "effect_key")
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
                    self.changed_heads.append((*head[1:16], head[17], invocation_id))
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


_HEAD_TABLE = (
    "invocation_id", "agent", "agent_version", "task_class", "goal", "status", "reason",
    "answer", "detail", "steps", "tool_calls", "input_tokens", "output_tokens", "cost",
    "started_at", "ended_at", "started_position", "events",
)  # fmt: skip
_HEAD_UPDATE = tuple(c for c in _HEAD_TABLE if c not in ("invocation_id", "started_position"))
_HEAD_FIXED = ("agent_name", "agent_version", "task_class", "goal", "started_at")
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
)
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
    return _from_rows(rows[0], steps, calls)


def _from_rows(
    head: dict[str, Any], step_rows: list[dict[str, Any]], calls: list[dict[str, Any]]
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
            )
        )
    return Trajectory(
        invocation_id=head["invocation_id"],
        goal=head["goal"],
        agent_name=head["agent"],
        agent_version=head["agent_version"],
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
    )


def _json(value: Any) -> str | None:
    return None if value is None else canonical_json(value)


def _loads(text: str | None) -> JsonValue:
    return None if text is None else from_json(text)


def list_invocations(
    runner: ProjectionRunner,
    *,
    reason: str | None = None,
    agent: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Invocations from the trajectory read model, newest first, optionally filtered."""
    clauses, params = [], []
    if reason is not None:
        clauses.append("reason = ?")
        params.append(reason)
    if agent is not None:
        clauses.append("agent = ?")
        params.append(agent)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return runner.query(
        "SELECT invocation_id, agent, task_class, status, reason, steps, tool_calls, "
        f"started_at, ended_at, goal FROM trajectory_invocations {where} "
        "ORDER BY started_position DESC LIMIT ?",
        [*params, limit],
    )


def load_trajectory(runner: ProjectionRunner, invocation_id: str) -> Trajectory | None:
    """An invocation's trajectory as the read model holds it (None if unknown)."""
    return _read(runner.query, invocation_id)
