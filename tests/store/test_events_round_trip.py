"""Every event the core can produce reads back from the store equal to what was appended.

Hypothesis drives the turn core (``TurnCore``, over a real ``Toolbox``) as the shell
would, drawing each observation when the core asks for it, and appends every commit
to an ``EventStore`` (a SQLite file, and ``memory://``, with snapshots every few
events). Then each aggregate's rows are read back: every event decodes and equals the
one appended, every snapshot decodes and equals a snapshot of the replayed events,
the invocation loads, and its chains verify.

Inputs drawn (issue 33, item A: a ``None`` proposal was stored unreadable):

* proposals: ``None``, booleans, integers past 64 bits, NaN and ±Infinity, texts with
  lone surrogates and terminal escapes, bytes, sets, tuples, an ``object()``, lists and
  objects of those, decisions of every kind with odd field values (a number as the
  answer, ``None`` as the reason), tool batches (known, unknown and duplicate ids,
  empty ids, arguments as objects, JSON text (also nested 70-400 deep, with NaN,
  ``1e400`` or a lone surrogate) or lists, nested parents of sensitive paths as text,
  numbers, lists, null), the same as JSON text, decision models;
* usages: none, plain, and built without validation (negative, NaN, fractional);
* model failures, time-outs and interruptions; a policy that refuses calls or the run;
* tool outputs of any JSON (NaN, surrogates, huge integers), errors of every class,
  runs cut short by a cancel or the deadline;
* services answering committed, rejected or not found with any receipt and reason,
  unreachable, or an attempt still running;
* a verifier's evidence; approvals, denials, answers to questions, cancels of paused
  runs, hand resolutions of open writes, settlements of writes after the end;
* crashes at any action (uncommitted events dropped, the core rebuilt from the
  store's events), leases taken, settings changed on resume, cancel requests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import Phase as Stage
from hypothesis import strategies as st

from aggregates.decisions import (
    DECISION_ADAPTER,
    Budget,
    EffectStatus,
    ErrorClass,
    ErrorInfo,
    ToolResult,
    Usage,
    built,
)
from aggregates.effect import Effect, EffectEvent, Resolution
from aggregates.events import DomainEvent, fold
from aggregates.invocation import (
    DecisionProposed,
    DispatchedCall,
    Invocation,
    InvocationEvent,
    InvocationSnapshot,
    Phase,
    replay,
)
from aggregates.requests import CancelRequest
from aggregates.results import Interruption, interrupted_result
from aggregates.settings import RunSettings
from aggregates.turn import (
    Action,
    AskModel,
    AttemptStillRunning,
    Authorise,
    Continue,
    EffectAnswered,
    EffectObservation,
    Finished,
    LoadEffects,
    ModelAnswered,
    ModelFailed,
    ModelInterrupted,
    ModelObservation,
    ModelTimedOut,
    Moment,
    PolicyVerdict,
    Reconcile,
    RunCalls,
    ServiceUnreachable,
    TurnCore,
    Verify,
    cancel_paused,
    settle_ended_effect,
)
from aggregates.values import safe_text
from loop_actors import tool
from loop_actors.agent.tools import Toolbox
from loop_actors.audit.verify import verify_invocation
from loop_actors.store.store import EventStore

AT = datetime(2026, 1, 1, tzinfo=UTC)


# --------------------------------------------------------------------------- the tools


def _toolbox() -> Toolbox:
    @tool
    def lookup(q: str, limit: int = 10) -> str:
        """Look something up."""
        return q

    @tool(effect="write", sensitive_arguments=["card"], sensitive_output=["token"])
    def pay(card: str, amount: int) -> dict[str, str]:
        """Pay with a card."""
        return {"token": card}

    @tool(effect="write", requires_approval=True)
    def delete(path: str) -> str:
        """Delete a file (a person approves it)."""
        return path

    @tool(sensitive_arguments=["payer.card"])
    def charge(payer: Any) -> str:
        """Charge a payer (any shape is accepted)."""
        return "charged"

    return Toolbox([lookup, pay, delete, charge], default_timeout_s=30.0)


TOOLBOX = _toolbox()
NAMES = ["lookup", "pay", "delete", "charge"]


# --------------------------------------------------------------------------- values


TEXT = st.one_of(
    st.text(max_size=10),
    st.sampled_from(["\ud800", "a\udcffb", "\x1b[31mred", "é✓😀", "", " ", "[redacted]"]),
)
SAFE_TEXT = TEXT.map(safe_text)
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
JSON_SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
CHILD_IDS = st.none() | st.lists(
    st.text(alphabet="0123456789abcdef", min_size=1, max_size=8).map("child-".__add__),
    min_size=1,
    max_size=3,
)
"""What a write's result names of the children its body ran (``ToolResult.child_ids``)."""

JSON = st.recursive(
    JSON_SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=6,
)
ODD_OBJECTS = st.sampled_from(["set", "tuple", "bytes", "bad-bytes", "object"]).map(
    lambda kind: {
        "set": lambda: {1, "a"},
        "tuple": lambda: (1, "t"),
        "bytes": lambda: b'{"kind": "final", "answer": "b"}',
        "bad-bytes": lambda: b"\xff\xfe",
        "object": object,
    }[kind]()
)


def rarely(draw: Callable[..., Any], one_in: int) -> bool:
    """True about once in ``one_in`` draws (False, the usual way, is what a failure shrinks to)."""
    return bool(draw(st.integers(min_value=0, max_value=one_in - 1)) == 1)


def _json_text(value: Any) -> str:
    return json.dumps(value, allow_nan=True, default=repr)


UNSTORABLE_TEXT = st.one_of(
    st.sampled_from(['{"q": NaN}', '{"q": 1e400}', '{"q": "\\ud800"}', "not json"]),
    st.sampled_from([70, 100, 400]).map(lambda n: '{"q": ' + "[" * n + "]" * n + "}"),
)
"""Arguments as JSON text whose value cannot be stored once parsed (or that is no JSON)."""


@st.composite
def arguments(draw: st.DrawFn, name: str) -> Any:
    """A call's arguments: right for the tool, or wrong in one of many ways."""
    card = draw(st.sampled_from(["4111111111111111", "5500 0000 0000 0004"]))
    table: dict[str, dict[str, Any]] = {
        "lookup": {"q": draw(TEXT)},
        "pay": {"card": card, "amount": draw(st.integers(min_value=0, max_value=99))},
        "delete": {"path": draw(TEXT)},
        "charge": {"payer": {"card": card}},
        "nope": {"x": 1},
    }
    fitting = table[name]
    parent = draw(
        st.sampled_from(
            [
                {"card": card},
                _json_text({"card": card}),
                [{"card": card}],
                [_json_text({"card": card})],
                card,
                4111111111111111,
                None,
                True,
            ]
        )
    )
    choice = draw(st.integers(min_value=0, max_value=11))
    if choice == 9:
        return draw(UNSTORABLE_TEXT)
    if choice == 0 or choice > 8:
        return fitting
    if choice == 5:
        return {"payer": parent} if name == "charge" else {**fitting, "payer": parent}
    if choice == 6:
        return _json_text(fitting)
    if choice == 7:
        return {**fitting, draw(TEXT): draw(JSON)}
    if choice == 8:
        return draw(JSON)
    return {key: draw(JSON) for key in fitting}


@st.composite
def fitting_calls(draw: st.DrawFn) -> dict[str, Any]:
    """A batch that is valid (so that it runs): known tools, their arguments, unique ids."""
    card = draw(st.sampled_from(["4111111111111111", "5500 0000 0000 0004"]))
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3))
    fitting = {
        "lookup": {"q": "x"},
        "pay": {"card": card, "amount": draw(st.integers(min_value=0, max_value=99))},
        "delete": {"path": "notes.txt"},
        "charge": {"payer": draw(st.sampled_from([{"card": card}, _json_text({"card": card})]))},
    }
    return {
        "kind": "tool_calls",
        "calls": [
            {"id": f"c{i}", "name": name, "arguments": fitting[name]}
            for i, name in enumerate(names)
        ],
    }


@st.composite
def tool_calls(draw: st.DrawFn) -> dict[str, Any]:
    calls = []
    for index in range(draw(st.integers(min_value=0, max_value=3))):
        name = draw(st.sampled_from([*NAMES, "nope"]))
        call_id = draw(st.sampled_from([f"c{index}", f"c{index}", "same", "", "\udcff"]))
        if rarely(draw, 4):  # text that parses into what cannot be stored, for a known tool
            name, given = "lookup", draw(UNSTORABLE_TEXT)
        else:
            given = draw(arguments(name))
        call: dict[str, Any] = {"id": call_id, "name": name, "arguments": given}
        if rarely(draw, 10):
            call["note"] = draw(JSON)
        calls.append(call)
    return {"kind": "tool_calls", "calls": calls}


DECISIONS = st.one_of(
    fitting_calls(),
    tool_calls(),
    fitting_calls(),
    st.just({"kind": "final", "answer": "done"}),
    st.builds(lambda a: {"kind": "final", "answer": a}, st.one_of(TEXT, JSON)),
    st.builds(lambda q: {"kind": "clarification", "question": q}, TEXT),
    st.builds(lambda r: {"kind": "cannot_continue", "reason": r}, st.one_of(TEXT, st.none())),
    st.builds(
        lambda d, s: {"kind": "request_approval", "proposal_digest": d, "summary": s}, TEXT, TEXT
    ),
)


def _as_model(decision: dict[str, Any]) -> Any:
    try:
        return DECISION_ADAPTER.validate_python(decision)
    except ValueError:
        return decision


PROPOSALS = st.one_of(
    fitting_calls(),
    DECISIONS,
    tool_calls(),
    tool_calls(),
    fitting_calls(),
    DECISIONS,
    DECISIONS.map(_json_text),
    DECISIONS.map(_as_model),
    st.none(),
    JSON,
    ODD_OBJECTS,
    st.lists(ODD_OBJECTS, max_size=2),
)

USAGES = st.one_of(
    st.just(Usage()),
    st.just(Usage()),
    st.just(Usage()),
    st.builds(
        Usage,
        input_tokens=st.integers(min_value=0, max_value=10_000),
        output_tokens=st.integers(min_value=0, max_value=10_000),
        cost=st.floats(min_value=0, max_value=10),
    ),
    st.builds(
        lambda i, o, c: Usage.model_construct(
            input_tokens=i, output_tokens=o, cost=c, latency_ms=0.0, attempts=None
        ),
        st.one_of(st.integers(min_value=-5, max_value=5), NUMBERS),
        st.integers(min_value=-5, max_value=5),
        NUMBERS,
    ),
)

BUDGETS = st.builds(
    Budget,
    max_steps=st.integers(min_value=2, max_value=8),
    max_tool_calls=st.integers(min_value=1, max_value=8),
    max_repeated_plan=st.integers(min_value=1, max_value=3),
    deadline_s=st.one_of(st.none(), st.none(), st.none(), st.floats(min_value=5, max_value=80)),
    max_tokens=st.one_of(st.none(), st.integers(min_value=1_000, max_value=40_000)),
    wind_down_steps=st.one_of(st.none(), st.integers(min_value=1, max_value=2)),
)
RUN_SETTINGS = st.builds(
    RunSettings,
    max_invalid_proposals=st.integers(min_value=1, max_value=4),
    max_verification_attempts=st.integers(min_value=1, max_value=3),
    max_repeated_failures=st.integers(min_value=2, max_value=4),
    context_limit=st.one_of(st.none(), st.integers(min_value=200, max_value=2_000)),
    keep_recent_turns=st.integers(min_value=1, max_value=2),
    max_output_bytes=st.sampled_from([1_000, 1_000_000]),
    max_proposal_bytes=st.sampled_from([1_000, 256_000]),
)


# --------------------------------------------------------------------------- the shell


class Drive:
    """The shell without I/O: draws what each action gives, appends each commit to a store."""

    def __init__(self, data: st.DataObject, store: EventStore) -> None:
        self.data = data
        self.store = store
        self.draw = data.draw
        self.seconds = 0.0
        self.cancel = False
        self.committed: dict[str, list[DomainEvent]] = {}
        """Every event appended, by aggregate id, in order."""
        self.verifies = self.draw(st.booleans())
        self.authorises = self.draw(st.booleans())
        self.settings = self.draw(RUN_SETTINGS)
        invocation = Invocation.start(
            invocation_id=uuid4().hex,
            goal=self.draw(SAFE_TEXT),
            agent_name="round-trip",
            agent_version="1",
            catalogue_digest=TOOLBOX.catalogue_digest,
            tools=TOOLBOX.specs,
            budget=self.draw(BUDGETS),
            settings=self.settings,
            at=AT,
        )
        self.invocation_id = invocation.id
        self.append(invocation.take_events())
        self.core = self._core(invocation)

    # ------------------------------------------------------------ the store

    def append(self, events: Sequence[DomainEvent]) -> None:
        if not events:
            return
        self.store.append(events)
        for event in events:
            self.committed.setdefault(event.originator_id, []).append(event)

    def commit(self) -> None:
        self.append(self.core.take_events())

    def replayed(self) -> Invocation:
        events = self.committed[self.invocation_id]
        invocation = replay(None, [e for e in events if isinstance(e, InvocationEvent)])
        assert invocation is not None
        return invocation

    def effects(self) -> dict[str, Effect]:
        found: dict[str, Effect] = {}
        for key, events in self.committed.items():
            if events and isinstance(events[0], EffectEvent):
                effect = fold(None, events)
                assert isinstance(effect, Effect)
                found[key] = effect
        return found

    # ------------------------------------------------------------ driving

    def _core(self, invocation: Invocation) -> TurnCore:
        return TurnCore(
            invocation,
            settings=self.settings,
            catalogue=TOOLBOX,
            verifies=self.verifies,
            authorises=self.authorises,
        )

    def moment(self) -> Moment:
        self.seconds += self.draw(st.sampled_from([0.0, 0.0, 0.0, 1.0, 7.0]))
        return Moment(
            at=AT + timedelta(seconds=self.seconds),
            elapsed_s=self.seconds,
            cancel_requested=self.cancel,
            cancel_detail="asked" if self.cancel else None,
        )

    def restart(self) -> None:
        """A crash: what was not committed is lost; a new core starts from the store."""
        self.core.take_events()
        invocation = self.replayed()
        if invocation.phase is not Phase.TERMINATED:
            if rarely(self.draw, 4):
                self.settings = self.draw(RUN_SETTINGS)
                invocation.change_settings(self.draw(BUDGETS), self.settings, at=self.moment().at)
            if rarely(self.draw, 4):
                invocation.acquire_lease(
                    "w" + self.draw(SAFE_TEXT), invocation.lease_epoch + 1, at=self.moment().at
                )
        self.append(list(invocation.take_events()))
        self.core = self._core(invocation)

    def run(self) -> None:
        action: Action = self.core.next(self.moment())
        for _ in range(80):
            if action.commits_first:
                self.commit()
            if rarely(self.draw, 15):
                self.restart()
                action = self.core.next(self.moment())
                continue
            if not self.cancel and rarely(self.draw, 60):
                self.cancel = True
                request = CancelRequest.record(self.invocation_id, at=AT, by=self.draw(SAFE_TEXT))
                self.append(list(request.take_events()))
            next_action = self.perform(action)
            if next_action is None:
                return
            action = next_action

    def perform(self, action: Action) -> Action | None:
        core, draw = self.core, self.draw
        match action:
            case AskModel():
                return core.on_model(self.model(), self.moment())
            case Authorise(calls=calls):
                return core.on_authorised(self.policy(calls), self.moment())
            case RunCalls(calls=calls):
                results, interruption = self.results(calls)
                return core.on_executed(results, interruption, self.moment())
            case LoadEffects(keys=keys):
                effects = self.effects()
                return core.on_effects_loaded({k: effects.get(k) for k in keys}, self.moment())
            case Reconcile(effects=asked):
                return core.on_reconciled(
                    {key: draw(self.service_answer(key)) for key, _ in asked}, self.moment()
                )
            case Verify():
                return core.on_verified(draw(st.one_of(st.none(), SAFE_TEXT)), self.moment())
            case Continue():
                return core.next(self.moment())
            case Finished():
                return self.after_stop()
        raise AssertionError(action)

    def model(self) -> ModelObservation:
        kind = self.draw(st.integers(min_value=0, max_value=59))
        if kind == 1:
            return ModelFailed(error_type="RuntimeError", message=self.draw(SAFE_TEXT))
        if kind == 2:
            return ModelTimedOut()
        if kind == 3:
            return ModelInterrupted()
        usage = self.draw(USAGES) if rarely(self.draw, 4) else Usage()
        return ModelAnswered(proposal=self.draw(PROPOSALS), usage=usage)

    def policy(self, calls: list[DispatchedCall]) -> PolicyVerdict:
        if rarely(self.draw, 10):
            return PolicyVerdict(stop=self.draw(SAFE_TEXT))
        refused = {call.call_id: self.draw(SAFE_TEXT) for call in calls if rarely(self.draw, 3)}
        return PolicyVerdict(refused=refused)

    def results(self, calls: list[DispatchedCall]) -> tuple[list[ToolResult], Interruption]:
        interruption = self.draw(
            st.sampled_from(
                [Interruption.NONE] * 14 + [Interruption.CANCELLED, Interruption.DEADLINE]
            )
        )
        cut = self.draw(st.integers(min_value=0, max_value=len(calls)))
        results = []
        for index, call in enumerate(calls):
            if interruption is not Interruption.NONE and index >= cut:
                results.append(interrupted_result(call, interruption, started=index == cut))
                continue
            failed = self.draw(st.booleans())
            write = call.effect_key is not None
            status: EffectStatus | None = None
            if write:
                status = (
                    self.draw(
                        st.sampled_from([EffectStatus.REJECTED, EffectStatus.OUTCOME_UNKNOWN])
                    )
                    if failed
                    else EffectStatus.COMMITTED
                )
            error = (
                ErrorInfo(
                    error_class=self.draw(st.sampled_from(list(ErrorClass))),
                    retryable=self.draw(st.booleans()),
                    message=self.draw(SAFE_TEXT),
                )
                if failed
                else None
            )
            results.append(
                built(
                    ToolResult,
                    {
                        "call_id": call.call_id,
                        "name": call.name,
                        "output": None if failed else self.draw(JSON),
                        "error": error,
                        "duration_ms": 1.0,
                        "effect_key": call.effect_key,
                        "effect_status": status,
                        "child_ids": self.draw(CHILD_IDS) if call.effect_key else None,
                    },
                )
            )
        return results, interruption

    def service_answer(self, key: str) -> st.SearchStrategy[EffectObservation]:
        return st.one_of(
            st.builds(
                lambda status, receipt, reason: EffectAnswered(
                    effect_key=key, status=status, receipt=receipt, reason=reason
                ),
                st.sampled_from(list(Resolution)),
                JSON,
                st.one_of(st.none(), SAFE_TEXT),
            ),
            st.builds(lambda error: ServiceUnreachable(effect_key=key, error=error), SAFE_TEXT),
            st.just(AttemptStillRunning(effect_key=key, waited_s=3.0)),
        )

    def after_stop(self) -> Action | None:
        """Paused: a person (or the sweeper) acts, then a new run goes on; ended: settle."""
        draw = self.draw
        invocation = self.replayed()
        at = self.moment().at
        choice = draw(st.integers(min_value=0, max_value=5))
        if invocation.phase is Phase.TERMINATED:
            for effect in self.effects().values():
                if effect.is_open and choice:
                    answer = draw(self.service_answer(effect.key))
                    if isinstance(answer, EffectAnswered):
                        settle_ended_effect(
                            invocation, effect, answer, TOOLBOX, max_bytes=1_000, at=at
                        )
                        self.append(list(effect.take_events()))
            return None
        if choice == 1:
            return None  # left paused
        if choice == 2:
            cancel_paused(invocation, draw(SAFE_TEXT), at=at)
            self.append(list(invocation.take_events()))
            return None
        paused = invocation.paused
        match invocation.phase:
            case Phase.AWAITING_APPROVAL if paused is not None and paused.proposal_digest:
                if draw(st.booleans()):
                    invocation.grant_approval(
                        paused.proposal_digest, by="ann", note=draw(st.none() | SAFE_TEXT), at=at
                    )
                else:
                    invocation.deny_approval(
                        paused.proposal_digest, by="ann", reason=draw(SAFE_TEXT) or "no", at=at
                    )
            case Phase.AWAITING_CLARIFICATION:
                invocation.provide_clarification(draw(SAFE_TEXT) or "this", by="bob", at=at)
            case Phase.AWAITING_RECONCILIATION:
                self._resolve_by_hand(invocation, at)
            case _:
                pass
        self.append(list(invocation.take_events()))
        self.core = self._core(invocation)
        return self.core.next(self.moment())

    def _resolve_by_hand(self, invocation: Invocation, at: datetime) -> None:
        for effect in self.effects().values():
            if effect.is_open and self.draw(st.booleans()):
                committed = self.draw(st.booleans())
                effect.resolve_by_hand(
                    Resolution.COMMITTED if committed else Resolution.REJECTED,
                    by="carol",
                    invocation_phase=invocation.phase,
                    receipt={"ok": True} if committed else None,
                    reason=None if committed else "refused",
                    at=at,
                )
                self.append(list(effect.take_events()))


# --------------------------------------------------------------------------- the check


def _snapshot_json(invocation: Any) -> str:
    return InvocationSnapshot.take(invocation).model_dump_json()


def check_read_back(store: EventStore, drive: Drive) -> None:
    """Each aggregate's rows decode into the events appended; snapshots and chains hold."""
    for aggregate_id, written in drive.committed.items():
        read = [event for _, event in store.stored_entries(aggregate_id)]
        assert not [e for e in read if isinstance(e, Exception)], read
        assert read == written, aggregate_id
    events = [e for e in drive.committed[drive.invocation_id] if isinstance(e, InvocationEvent)]
    for version, snapshot in store.stored_snapshots(drive.invocation_id).get(
        drive.invocation_id, []
    ):
        assert not isinstance(snapshot, Exception), snapshot
        assert snapshot.model_dump_json() == _snapshot_json(replay(None, events[:version]))
    assert _snapshot_json(store.get(drive.invocation_id)) == _snapshot_json(replay(None, events))
    reports = verify_invocation(store, drive.invocation_id)
    assert reports
    assert all(report.intact for report in reports), reports


def _round_trips(store: EventStore, examples: int) -> None:
    # No shrinking: a drawn run is a long chain of draws, and shrinking one took over
    # five minutes; a failure prints every draw of its run as it was drawn.
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Stage.explicit, Stage.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def one(data: st.DataObject) -> None:
        drive = Drive(data, store)
        drive.run()
        check_read_back(store, drive)

    one()


def _with_store(url: str, use: Callable[[EventStore], None]) -> None:
    store = EventStore(url, snapshot_interval=4)
    try:
        use(store)
    finally:
        store.close()


def test_every_event_the_core_makes_reads_back_equal_from_a_sqlite_file(tmp_path: Path) -> None:
    _with_store(f"sqlite:///{tmp_path / 'events.db'}", lambda store: _round_trips(store, 100))


def test_every_event_the_core_makes_reads_back_equal_from_memory() -> None:
    _with_store("memory://", lambda store: _round_trips(store, 50))


def test_a_none_proposal_is_among_what_the_round_trip_draws() -> None:
    """The drawing reaches the case of item A (a rejected ``None``), and it reads back."""
    store = EventStore("memory://")
    try:
        invocation = Invocation.start(
            invocation_id="n",
            goal="g",
            agent_name="a",
            agent_version="1",
            catalogue_digest=TOOLBOX.catalogue_digest,
            tools=TOOLBOX.specs,
            budget=Budget(),
            settings=RunSettings(),
            at=AT,
        )
        core = TurnCore(invocation, settings=RunSettings(), catalogue=TOOLBOX)
        core.next(Moment(at=AT, elapsed_s=0.0))
        core.on_model(ModelAnswered(proposal=None), Moment(at=AT, elapsed_s=0.0))
        written = [*invocation.take_events(), *core.take_events()]
        store.append(written)
        assert [e for _, e in store.stored_entries("n")] == written
    finally:
        store.close()


@pytest.mark.parametrize(
    "text",
    [
        '{"q": ' + "[" * 100 + "]" * 100 + "}",
        '{"q": ' + "[" * 400 + "]" * 400 + "}",
        '{"q": NaN}',
        '{"q": 1e400}',
        '{"q": "\\ud800"}',
    ],
    ids=["deep-100", "deep-400", "nan", "1e400", "surrogate"],
)
def test_arguments_as_json_text_that_cannot_be_stored_are_dropped_from_a_refused_proposal(
    text: str,
) -> None:
    """Redacting a refused proposal parses its JSON text with the same guard as the rest.

    Found by the edge fuzz: a text nested too deep was parsed (without the depth guard)
    into a rejection pydantic cannot build, and NaN into one stored as ``null``.
    """
    invocation = Invocation.start(
        invocation_id="deep",
        goal="g",
        agent_name="a",
        agent_version="1",
        catalogue_digest=TOOLBOX.catalogue_digest,
        tools=TOOLBOX.specs,
        budget=Budget(),
        settings=RunSettings(),
        at=AT,
    )
    core = TurnCore(invocation, settings=RunSettings(), catalogue=TOOLBOX)
    moment = Moment(at=AT, elapsed_s=0.0)
    core.next(moment)
    proposal = {"kind": "tool_calls", "calls": [{"id": "c", "name": "lookup", "arguments": text}]}
    core.on_model(ModelAnswered(proposal=proposal), moment)
    written = list(invocation.take_events())
    [rejected] = [e for e in written if isinstance(e, DecisionProposed)]
    assert rejected.rejection is not None
    raw: Any = rejected.rejection.raw
    assert raw["calls"][0]["arguments"]["dropped"] is True
    store = EventStore("memory://")
    try:
        store.append(written)
        assert [e for _, e in store.stored_entries("deep")] == written
    finally:
        store.close()
