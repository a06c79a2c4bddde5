"""An invocation's committed turns: what the model will see of each step.

:class:`Turn` is one committed turn; :class:`Turns` the read-only sequence an
invocation (and its snapshot) holds, each turn kept as stored until it is read.
Importable from :mod:`aggregates.invocation` as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from pydantic import Field, GetCoreSchemaHandler, ValidationInfo
from pydantic_core import core_schema

from aggregates.decisions import Decision, Frozen, Rejection, ToolResult


class Turn(Frozen):
    """One committed turn as the model will see it: what was decided and what came back."""

    step: int
    decision: Decision | None = None
    rejection: Rejection | None = None
    results: list[ToolResult] = Field(default_factory=list)
    """The batch's results (a factory: pydantic deep-copies a list default for each turn)."""
    approval: str | None = None
    """For an approved or denied batch: who decided, and why."""
    reply: str | None = None
    """For a clarification: the person's answer."""
    verification: str | None = None
    """For a final answer the verifier refused: its evidence."""
    critique: str | None = None
    """For a final answer the critic sent back (``revise``): its critique."""


LAZY_TURNS = "loop-actors: turns as stored"
"""The validation context that keeps a snapshot's turns as stored until each is read.

``InvocationSnapshot.model_validate_json(data, context=LAZY_TURNS)`` validates
everything but the turns, which it keeps in their stored form: :class:`Turns`
validates each one, as :class:`Turn`, the first time it is read. What a load needs
(the phase, the step, the totals and budgets, the pending batch, the last turn)
then costs nothing per turn of history; the model's next request reads them all.
"""

_StoredTurn = Turn | str | dict[str, Any]
"""A turn as :class:`Turns` holds it: validated, or as stored (its JSON text, or, in
snapshots written before the turns were stored as text, its JSON object)."""

_STORED = frozenset({str, dict, Turn})


class Turns(Sequence[Turn]):
    """An invocation's committed turns, oldest first (a read-only sequence of :class:`Turn`).

    In a snapshot each turn is stored as its own JSON text (``Turn.model_dump_json``
    with ``exclude_none``), so that a snapshot is read without building the turns,
    and a turn read from one is written into the next as it was read. Snapshots
    written before hold each turn as a JSON object; both are read.

    Turns read from a snapshot with :data:`LAZY_TURNS` are validated the first time
    each is read (a stored turn that is not a valid ``Turn`` raises
    ``pydantic.ValidationError`` then); read without it, all are validated at once.
    Equality compares the turns themselves.
    """

    __slots__ = ("_items",)

    def __init__(self, turns: Iterable[Turn] = ()) -> None:
        """Hold these turns (each already a ``Turn``)."""
        self._items: list[_StoredTurn] = list(turns)

    @classmethod
    def _as_stored(cls, stored: list[_StoredTurn]) -> Turns:
        turns = cls()
        turns._items = stored
        return turns

    def copy(self) -> Turns:
        """A new sequence of the same turns (each turn is frozen: they are shared)."""
        return Turns._as_stored(list(self._items))

    def append(self, turn: Turn) -> None:
        """Add the turn of a new step (the aggregate's, in ``_evolve``)."""
        self._items.append(turn)

    def replace_last(self, turn: Turn) -> None:
        """Put the latest turn, with what it was given since (the aggregate's, in ``_evolve``)."""
        self._items[-1] = turn

    def _turn(self, index: int) -> Turn:
        item = self._items[index]
        if type(item) is Turn:
            return item
        turn = Turn.model_validate_json(item) if type(item) is str else Turn.model_validate(item)
        self._items[index] = turn
        return turn

    def _texts(self) -> list[str]:
        """Each turn's JSON text, as a snapshot stores it (one read as text is not re-encoded)."""
        return [
            item if type(item) is str else self._turn(index).model_dump_json(exclude_none=True)
            for index, item in enumerate(self._items)
        ]

    def __len__(self) -> int:
        """How many turns."""
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Turn: ...
    @overload
    def __getitem__(self, index: slice) -> list[Turn]: ...
    def __getitem__(self, index: int | slice) -> Turn | list[Turn]:
        """A turn (validated now if it is still as stored), or a list of them for a slice."""
        if isinstance(index, slice):
            return [self._turn(i) for i in range(*index.indices(len(self._items)))]
        return self._turn(index)

    def __iter__(self) -> Iterator[Turn]:
        """The turns, oldest first."""
        for index in range(len(self._items)):
            yield self._turn(index)

    def __eq__(self, other: object) -> bool:
        """Equal to a sequence of the same turns (a ``Turns`` or a list)."""
        if not isinstance(other, Turns | list):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        """The turns as a list shows them."""
        return f"Turns({list(self)!r})"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """A list of turns (or of their JSON texts); dumped to JSON as texts, to Python as turns."""

        def validate(
            value: Any,
            validate_list: core_schema.ValidatorFunctionWrapHandler,
            info: ValidationInfo,
        ) -> Turns:
            if isinstance(value, Turns):
                return value.copy()
            lazy = info.context == LAZY_TURNS
            if type(value) is not list or not set(map(type, value)) <= _STORED:
                return cls(validate_list(value))  # it raises, saying which item is not a turn
            if not lazy and str not in set(map(type, value)):
                return cls(validate_list(value))  # turns, or turns as JSON objects
            turns = cls._as_stored(list(value))
            if not lazy:
                for index in range(len(turns)):
                    turns._turn(index)
            return turns

        def serialize(turns: Turns, info: core_schema.SerializationInfo) -> list[Turn] | list[str]:
            return turns._texts() if info.mode_is_json() else list(turns)

        return core_schema.with_info_wrap_validator_function(
            validate,
            handler.generate_schema(list[Turn]),
            serialization=core_schema.plain_serializer_function_ser_schema(
                serialize,
                info_arg=True,
                return_schema=handler.generate_schema(list[Turn | str]),
            ),
        )
