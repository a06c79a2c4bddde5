"""The event store's encoding: compact, lossless, and readable back into the same events."""

from __future__ import annotations

import types
import typing
from typing import Any

import pytest
from pydantic import BaseModel

from aggregates.effect import EFFECT_EVENT_TYPES
from aggregates.invocation import EVENT_TYPES, InvocationSnapshot
from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, tool
from loop_actors._store import EventStore


def _admits_none(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return type(None) in typing.get_args(annotation)
    return annotation is type(None) or annotation is Any


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found.append(annotation)
    for argument in typing.get_args(annotation):
        found.extend(_models_in(argument))
    return found


@pytest.mark.parametrize(
    "event_type",
    [*EVENT_TYPES, *EFFECT_EVENT_TYPES, InvocationSnapshot],
    ids=lambda t: t.__name__,
)
def test_every_optional_field_defaults_to_none_so_leaving_nones_out_is_lossless(
    event_type: type[BaseModel],
) -> None:
    seen: set[type[BaseModel]] = set()
    pending: list[type[BaseModel]] = [event_type]
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            if _admits_none(field.annotation) and field.annotation is not Any:
                assert field.default is None, f"{model.__name__}.{name}"
            pending.extend(_models_in(field.annotation))


async def test_events_read_back_equal_to_what_was_written(db_url: str) -> None:
    @tool
    def echo(text: str) -> dict[str, Any]:
        """Echo with awkward values."""
        return {"text": text, "none": None, "nested": [1, 2.5, {"ü": True}]}

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c1", "name": "echo", "arguments": {"text": 'héllo\n"quoted"'}}],
            }
        return {"kind": "final", "answer": "✓"}

    async with Runtime(db_url) as runtime:
        outcome = await runtime.run(Agent("a", ScriptedModel(decide), [echo]), "goal ✓")
        written = await runtime.history(outcome.invocation_id)
    async with Runtime(db_url) as reopened:
        read = await reopened.history(outcome.invocation_id)
        invocation = await reopened.load(outcome.invocation_id)
    assert read == written
    assert invocation.turns[0].results[0].output == {
        "text": 'héllo\n"quoted"',
        "none": None,
        "nested": [1, 2.5, {"ü": True}],
    }


async def test_a_tool_output_that_is_not_json_becomes_an_output_invalid_result() -> None:
    @tool
    def opaque() -> object:
        """Return something JSON cannot hold."""
        return object()

    seen: list[Any] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c1", "name": "opaque", "arguments": {}}],
            }
        seen.extend(request.results)
        return {"kind": "final", "answer": "ok"}

    outcome = await Runtime("memory://").run(Agent("a", ScriptedModel(decide), [opaque]), "g")
    assert outcome.reason == "completed"
    assert seen[0].error.error_class == "output_invalid"


async def test_a_long_history_is_snapshotted_and_reads_back_the_same(db_url: str) -> None:
    from aggregates.events import fold
    from loop_actors import Budget

    @tool
    async def step(n: int) -> int:
        """Count."""
        return n

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step <= 80:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c", "name": "step", "arguments": {"n": request.step}}],
            }
        return {"kind": "final", "answer": "counted"}

    agent = Agent("long", ScriptedModel(decide), [step], Budget(max_steps=100, max_tool_calls=100))
    async with Runtime(db_url) as runtime:
        outcome = await runtime.run(agent, "count", invocation_id="long")
        events = await runtime.history("long")
    assert outcome.reason == "completed"
    assert len(events) > 200
    store = EventStore(db_url)
    snapshots = list(store.app.snapshots.get("long")) if store.app.snapshots else []
    assert [s.originator_version for s in snapshots] == [100, 200]
    assert all(isinstance(s, InvocationSnapshot) for s in snapshots)
    from_snapshot = store.get("long")
    from_events = fold(None, events)
    assert vars(from_snapshot) == vars(from_events)
    mid = store.app.repository.get("long", version=150, projector_func=fold)
    assert mid.version == 150
    assert vars(mid) == vars(fold(None, events[:150]))
