"""The one door to pydantic's internals: writing a model's four slots without validation.

pydantic v2 keeps a model in four slots of ``BaseModel``: ``__dict__`` (the field
values), ``__pydantic_fields_set__``, ``__pydantic_extra__`` and
``__pydantic_private__``. ``model_construct`` fills them in after looking for
defaults and aliases field by field; on a hot path, for values the runtime made
itself or read from validated events, :func:`built` writes them directly. That
relies on pydantic's layout, which is not public API: every use goes through this
module, and ``tests/aggregates/test_pydantic_slots.py`` fails loudly, naming this module,
when a pydantic upgrade changes the layout.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

_Built = TypeVar("_Built", bound=BaseModel)

PYDANTIC_SLOTS = (
    "__dict__",
    "__pydantic_fields_set__",
    "__pydantic_extra__",
    "__pydantic_private__",
)
"""The slots of ``BaseModel`` this module writes, in pydantic's order."""

# What object.__setattr__(model, name, value) does for each of pydantic's four slots, called
# on the slot's own descriptor: without looking the name up each time (a model built this way
# costs about 30 % less). They apply to a model of any class (each is BaseModel's).
SET_DICT = BaseModel.__dict__["__dict__"].__set__
SET_FIELDS_SET = BaseModel.__dict__["__pydantic_fields_set__"].__set__
SET_EXTRA = BaseModel.__dict__["__pydantic_extra__"].__set__
SET_PRIVATE = BaseModel.__dict__["__pydantic_private__"].__set__


def built(cls: type[_Built], fields: dict[str, Any]) -> _Built:
    """``cls.model_construct(**fields)`` when ``fields`` name every field of ``cls``.

    Nothing is validated and no default is filled in: for values the runtime made
    itself, or read from validated events, on a hot path (about 0.5 us against
    ``model_construct``'s 2 us, which loops over the model's fields to look for
    defaults and aliases). The model is the one ``model_construct`` makes: the same
    ``__dict__`` (``fields`` itself, so it must be the caller's own), fields set, no
    extra, no private attributes. As ``fields`` names every field, every model of a
    class shares one fields set (nothing changes a frozen model's; a copy copies it).
    """
    made = object.__new__(cls)
    SET_DICT(made, fields)
    every = _EVERY_FIELD.get(cls)
    if every is None:
        every = _EVERY_FIELD[cls] = set(cls.model_fields)
    SET_FIELDS_SET(made, every)
    SET_EXTRA(made, None)
    SET_PRIVATE(made, None)
    return made


_EVERY_FIELD: dict[type[BaseModel], set[str]] = {}


def set_in_place(model: BaseModel, name: str, value: Any) -> None:
    """Write one field of a model that nothing else has seen yet (a frozen one too), as set.

    For a value computed from the model itself (an event's hash over its own body):
    writing it in place saves a copy and a second validation. The model's fields set
    gains ``name`` without changing a set it may share with others (see :func:`built`).
    """
    model.__dict__[name] = value
    fields_set = model.__pydantic_fields_set__
    if name not in fields_set:
        SET_FIELDS_SET(model, fields_set | {name})


__all__ = [
    "PYDANTIC_SLOTS",
    "SET_DICT",
    "SET_EXTRA",
    "SET_FIELDS_SET",
    "SET_PRIVATE",
    "built",
    "set_in_place",
]
