"""Models that user code hands the runtime, validated again where they cross.

pydantic validates a model when its constructor builds it, not when
``model_construct`` does, nor ``model_copy(update=...)``: an instance of the right
class may hold anything (``Final.model_construct(answer=1.5)``). So a model that
user code gives the runtime is never trusted for its class. Each crossing asks this
module what it may take:

* a model's proposal, as every proposal: dumped (:func:`decision_fields`) and
  validated as a decision (:func:`aggregates.decisions.parse_decision`); a
  malformed one is a rejection, as a malformed dict is;
* a model's usage: :func:`admitted_usage` (exact types are enough; a subclass is
  validated again); a malformed one is ``model_error``, as a negative one is;
* a tool's ``ToolError``: :func:`tool_error_fields`; a malformed one is an
  unexpected failure of the tool (a write's outcome unknown);
* a service's ``Reconciled``, a policy's ``Deny``, an agent's ``Budget`` and
  ``Price``, a replay's filter: :func:`revalidated`; the shell turns a
  :class:`MalformedValueError` into an unreachable service, a refused call, or a
  ``UsageError``.

Every check is pure and reads the instance's own fields, never its methods
(``model_dump`` is asked not to warn: a constructed model dumps what it holds).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from aggregates.decisions import ErrorClass, Frozen, Usage
from aggregates.errors import AggregateError
from aggregates.values import safe_text, usage_problem

_Model = TypeVar("_Model", bound=BaseModel)


class MalformedValueError(AggregateError, ValueError):
    """Raised when a model that user code handed in is not a valid instance of its class.

    ``problems`` says what is wrong, field by field (``status: Input should be ...``),
    without the values (they may be secrets).
    """

    def __init__(self, model: type[BaseModel], problems: list[str]) -> None:
        self.model = model
        self.problems = problems
        super().__init__(f"a malformed {model.__name__}: {'; '.join(problems)}")


def validation_problems(error: ValidationError, *, whole: str = "the value") -> list[str]:
    """A validation error as one text per problem, ``field.path: message``, without the input.

    ``whole`` names the value itself, for a problem that is not in one of its fields.
    """
    return [
        f"{'.'.join(str(part) for part in item['loc']) or whole}: {item['msg']}"
        for item in error.errors()
    ]


def model_fields_of(cls: type[BaseModel], value: BaseModel) -> dict[str, Any]:
    """The values of ``cls``'s fields that ``value`` holds, as plain data, without warnings.

    What ``cls.model_validate`` is given to validate ``value`` again: nested models
    become dicts (so they are validated again too); a field ``cls`` does not declare
    (a subclass's own) is left out; a field that was never set is missing.

    Raises:
        MalformedValueError: the instance cannot be read (a cycle, a broken serialiser).
    """
    try:
        fields: dict[str, Any] = value.model_dump(
            include=set(cls.model_fields), by_alias=True, warnings=False
        )
    except Exception as error:  # a model built without validation may hold anything
        raise MalformedValueError(
            cls, [f"it cannot be read: {safe_text(error, limit=500)}"]
        ) from None
    return fields


def revalidated(cls: type[_Model], value: _Model) -> _Model:
    """``value`` (an instance of ``cls``, or of a subclass) validated again as a ``cls``.

    Returns a new, validated ``cls`` with the same field values (a subclass's own
    fields are dropped, as the runtime stores only ``cls``'s).

    Raises:
        MalformedValueError: a field is missing or does not hold a valid value.
    """
    fields = model_fields_of(cls, value)
    try:
        return cls.model_validate(fields)
    except ValidationError as error:
        raise MalformedValueError(cls, validation_problems(error)) from None


def admitted_usage(usage: object) -> Usage | str:
    """A model's reported usage as it is recorded, or why it cannot be (a ``model_error``).

    An exact ``Usage`` whose figures have exact types and are in range is taken as it
    is (:func:`aggregates.values.usage_problem`: the per-turn path, no validation); a
    subclass is validated again as a ``Usage``; anything else is refused.
    """
    if type(usage) is not Usage:
        if not isinstance(usage, Usage):
            return f"it is a {safe_text(type(usage).__name__, limit=100)}, not a Usage"
        try:
            usage = revalidated(Usage, usage)
        except MalformedValueError as error:
            return "; ".join(error.problems)
    problem = usage_problem(usage)
    return usage if problem is None else problem


class _ToolErrorFields(Frozen):
    """What a ``ToolError`` says besides its message: the class and whether to retry."""

    error_class: ErrorClass
    retryable: bool


def tool_error_fields(error_class: object, retryable: object) -> tuple[ErrorClass, bool] | str:
    """A ``ToolError``'s class and retry flag as the runtime takes them, or why it cannot.

    The class is an :class:`~aggregates.decisions.ErrorClass` (or its value); the flag
    a bool (or what pydantic reads as one: ``0``, ``"false"``...). Anything else makes
    the error malformed: the tool failed in a way it did not describe.
    """
    if type(error_class) is ErrorClass and type(retryable) is bool:
        return error_class, retryable
    try:
        fields = _ToolErrorFields.model_validate(
            {"error_class": error_class, "retryable": retryable}
        )
    except ValidationError as error:
        return "; ".join(validation_problems(error))
    return fields.error_class, fields.retryable


__all__ = [
    "MalformedValueError",
    "admitted_usage",
    "model_fields_of",
    "revalidated",
    "tool_error_fields",
    "validation_problems",
]
