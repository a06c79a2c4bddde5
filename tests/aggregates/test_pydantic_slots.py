"""aggregates.pydantic_slots, the one door to pydantic's internals: it fails loudly on an upgrade.

Each test names the module to revisit when pydantic changes what it relies on:
BaseModel's slots and their descriptors, and that ``built`` makes what
``model_construct`` makes (for a model with defaults, an alias, a nested model,
extra fields forbidden, and for one whose fields are all given).
"""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from aggregates import pydantic_slots
from aggregates.decisions import ErrorClass, ErrorInfo, ToolResult
from aggregates.pydantic_slots import PYDANTIC_SLOTS, built

REVISIT = "pydantic changed its model layout: revisit aggregates/pydantic_slots.py"


class Inner(BaseModel):
    model_config = ConfigDict(frozen=True)

    value: int


class Sample(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    count: int = 0
    tags: list[str] = Field(default_factory=list)
    inner: Inner | None = None
    renamed: str = Field(default="x", alias="other")


def everything_held(model: BaseModel) -> dict[str, Any]:
    """Each slot of ``BaseModel`` and each instance attribute pydantic keeps, by name."""
    held = {slot: getattr(model, slot) for slot in BaseModel.__slots__}
    held["class"] = type(model)
    return held


def test_pydantic_is_version_2() -> None:
    assert pydantic.VERSION.split(".")[0] == "2", REVISIT


def test_base_model_has_exactly_the_slots_the_door_writes() -> None:
    assert BaseModel.__slots__ == PYDANTIC_SLOTS, REVISIT


def test_each_slot_setter_is_its_slots_own_descriptor() -> None:
    setters = {
        "__dict__": pydantic_slots.SET_DICT,
        "__pydantic_fields_set__": pydantic_slots.SET_FIELDS_SET,
        "__pydantic_extra__": pydantic_slots.SET_EXTRA,
        "__pydantic_private__": pydantic_slots.SET_PRIVATE,
    }
    for slot, setter in setters.items():
        descriptor = BaseModel.__dict__[slot]
        assert setter.__self__ is descriptor, REVISIT
        assert setter.__name__ == "__set__", REVISIT


def test_built_makes_what_model_construct_makes_for_every_field_given() -> None:
    fields: dict[str, Any] = {"name": "a", "count": 2, "tags": ["t"], "inner": Inner(value=1)}
    made = built(Sample, {**fields, "renamed": "y"})
    expected = Sample.model_construct(**{**fields, "other": "y"})  # it takes the alias
    assert everything_held(made) == everything_held(expected), REVISIT
    assert made == expected, REVISIT
    assert made.model_dump_json() == expected.model_dump_json(), REVISIT
    assert made.model_copy(update={"count": 3}).count == 3, REVISIT


def test_built_makes_a_model_that_validation_makes_too() -> None:
    """What the runtime builds on its hot path equals the validated model, field for field."""
    fields: dict[str, Any] = {
        "call_id": "c1",
        "name": "lookup",
        "output": None,
        "error": ErrorInfo(error_class=ErrorClass.TOOL_FAILED, retryable=False, message="no"),
        "duration_ms": 1.5,
        "effect_key": None,
        "effect_status": None,
        "child_ids": None,
    }
    made = built(ToolResult, dict(fields))
    validated = ToolResult.model_validate(fields)
    assert everything_held(made) == everything_held(validated), REVISIT
    assert made.model_dump_json() == validated.model_dump_json(), REVISIT
    assert hash(made) == hash(validated), REVISIT
