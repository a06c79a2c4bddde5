"""Keeping secrets out of what is stored: rejected proposals, and texts that quote values.

A tool declares which of its arguments and output fields are sensitive; the turn
core stores ``"[redacted]"`` in their place. Three more ways a secret can reach
the store are closed here, as pure functions:

* **A rejected proposal** is stored to show what the model said. When the agent
  declares sensitive fields, :func:`redact_proposal` stores it redacted after
  parsing: JSON text (a whole proposal, a ``calls`` list, a call's arguments) is
  parsed and redacted like the object it holds; whatever cannot be redacted
  reliably is *dropped* — replaced by ``{"dropped": true, "size": N, "sha256":
  "..."}`` (the size in bytes and the SHA-256 of its UTF-8 text, canonical JSON
  for a value): text that is not JSON, a ``calls`` that is not a list, an item
  of it that is not an object, the arguments of a tool the agent does not have
  (no list of sensitive fields applies to them), an argument the tool does not
  have (it may be a sensitive one misspelt), and any field the decision schema
  does not name. A value on a sensitive path that is not an object where the path
  goes on through it (``payer`` given as the text ``'{"card": "4111…"}'``, a number,
  ``null``, a list of texts for ``payer.card``) is dropped too: no field can be
  found in it, and text may hold the secret.
* **Stored arguments and outputs** are redacted by :func:`redact_paths`, the one rule
  of the tools' ``sensitive_arguments`` and ``sensitive_output``: such a value (text
  or a number where the path needs an object) is replaced whole by ``"[redacted]"``.
* **Texts that quote a value** — a tool's error message, a service's reason, a
  validation problem, a model failure, a verifier's evidence — are scrubbed by
  :func:`scrub`: every known sensitive value in them becomes ``"[redacted]"``.
  :func:`redacted_values` finds those values, by comparing a real value with its
  redacted form.
* **A text that may quote a value nobody holds any more** (a service's reason
  about a call whose real arguments were deleted with its invocation's secrets)
  is withheld: :func:`withheld` keeps its size and digest only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from pydantic import JsonValue, ValidationError

from aggregates.decisions import (
    CannotContinue,
    Clarification,
    Final,
    RequestApproval,
    ToolCall,
    ToolCalls,
    ToolEffect,
)
from aggregates.digest import canonical_json, sha256_hex
from aggregates.values import parse_json_text

REDACTED = "[redacted]"
"""What a sensitive value is replaced with before it is stored."""

MIN_SCRUBBED_LENGTH = 3
"""Values shorter than this are not searched for in texts.

A one- or two-character value would erase ordinary words and digits everywhere
(and is no secret worth the name); declare such a field sensitive and it is
still redacted where it is stored as a field.
"""

_DECISION_FIELDS = frozenset(
    name
    for model in (Final, ToolCalls, RequestApproval, Clarification, CannotContinue)
    for name in model.model_fields
) - {"calls"}
"""The scalar fields a decision may have: kept in a rejected proposal (if scalar)."""

_CALL_FIELDS = frozenset({"id", "name"})
"""The scalar fields of a call kept in a rejected proposal (besides its arguments)."""

_SCALAR = (str, int, float, bool, type(None))


class ProposalRedactor(Protocol):
    """What redacting a proposal needs of the agent's tools."""

    @property
    def redacts(self) -> bool:
        """True when some tool declares sensitive fields."""

    def effect_of(self, name: str) -> ToolEffect | None:
        """The tool's effect, or None when there is no such tool."""

    def check_arguments(self, call: ToolCall) -> dict[str, Any]:
        """A call's arguments validated (``pydantic.ValidationError`` if not)."""

    def redact_arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Arguments as they may be stored."""

    def sensitive_arguments(self, name: str) -> Sequence[tuple[str, ...]]:
        """The tool's sensitive argument paths (none for a tool the agent does not have)."""


# --------------------------------------------------------------------------- sensitive paths


def redact_paths(value: Any, paths: Iterable[tuple[str, ...]]) -> Any:
    """A copy of a JSON value with the values at ``paths`` replaced by ``REDACTED``.

    A path that does not exist is ignored; a path through a list applies to each of
    its items. Where a path needs an object to go on and finds text or a number
    instead (``payer`` as the JSON text ``'{"card": "…"}'`` for ``payer.card``), that
    value is replaced whole: text may hold the secret in any form. ``null`` and
    booleans hold none and are kept; so is a value at the top (an output that is not
    an object has no fields). Returns ``value`` itself when nothing was replaced.
    """
    result = value
    for path in paths:
        result = _redact_path(result, path, top=True)
    return result


def _redact_path(value: Any, path: tuple[str, ...], *, top: bool) -> Any:
    if isinstance(value, list):
        items = [_redact_path(item, path, top=top) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, dict):
        head, rest = path[0], path[1:]
        if head not in value:
            return value
        copy = dict(value)
        copy[head] = REDACTED if not rest else _redact_path(value[head], rest, top=False)
        return copy
    if top or value is None or isinstance(value, bool):
        return value
    if isinstance(value, str | int | float) and value != REDACTED:
        return REDACTED  # not an object where the path goes on: it may hold the secret
    return value


def opaque_parents(value: Any, paths: Iterable[tuple[str, ...]]) -> list[tuple[Any, ...]]:
    """Where a sensitive path meets a value it cannot go through (keys and list indexes).

    Below the top, a value on one of ``paths`` that is not an object while the path
    goes on (text, a number, a boolean, ``null``; a list is gone through item by
    item). A refused proposal drops each (:func:`dropped`).
    """
    found: list[tuple[Any, ...]] = []
    for path in paths:
        _opaque(value, path, (), found, top=True)
    return found


def _opaque(
    value: Any,
    path: tuple[str, ...],
    where: tuple[Any, ...],
    found: list[tuple[Any, ...]],
    *,
    top: bool,
) -> None:
    if isinstance(value, list):
        for index, item in enumerate(value):
            _opaque(item, path, (*where, index), found, top=top)
    elif isinstance(value, dict):
        head, rest = path[0], path[1:]
        if head in value and rest:
            _opaque(value[head], rest, (*where, head), found, top=False)
    elif not top and where not in found:
        found.append(where)


# --------------------------------------------------------------------------- parts dropped


def _utf8(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    try:
        return canonical_json(value).encode()
    except (TypeError, ValueError, RecursionError):
        return type(value).__name__.encode()


def dropped(value: Any) -> dict[str, JsonValue]:
    """What is stored in place of a part that cannot be redacted: its size and digest."""
    data = _utf8(value)
    return {"dropped": True, "size": len(data), "sha256": sha256_hex(data)}


def withheld(text: str, why: str) -> str:
    """What is stored in place of a text that may quote a value nobody can scrub any more."""
    data = _utf8(text)
    return f"[withheld: {len(data)} bytes, sha256 {sha256_hex(data)}; {why}]"


def holds_redacted(value: Any) -> bool:
    """True when a stored value has a redacted field somewhere."""
    stack = [value]  # iterative: checked on every call's arguments before it runs
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif item == REDACTED:
            return True
    return False


# --------------------------------------------------------------------------- scrubbing


def _leaves(value: Any) -> list[str]:
    """The texts of a value's strings and numbers (what an error message may quote).

    A text that is JSON of an object or a list (a redacted ``payer`` given as
    ``'{"card": "…"}'``) also gives the leaves of what it holds.
    """
    if isinstance(value, str):
        return [value, *_text_leaves(value)]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        return [json.dumps(value)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list | tuple):
        return [leaf for item in value for leaf in _leaves(item)]
    return []


def _text_leaves(text: str) -> list[str]:
    if not text.lstrip().startswith(("{", "[")):
        return []
    parsed = _parsed(text)
    return _leaves(parsed) if isinstance(parsed, dict | list) else []


def redacted_values(real: Any, stored: Any) -> list[str]:
    """The texts of ``real``'s values that ``stored`` (its redacted form) replaced."""
    if stored is real:
        return []
    if isinstance(stored, str) and stored == REDACTED and real != REDACTED:
        return _leaves(real)
    if isinstance(real, dict) and isinstance(stored, dict):
        return [
            v
            for key in real.keys() & stored.keys()
            for v in redacted_values(real[key], stored[key])
        ]
    if isinstance(real, list) and isinstance(stored, list) and len(real) == len(stored):
        return [v for r, s in zip(real, stored, strict=True) for v in redacted_values(r, s)]
    return []


def _forms(value: str) -> set[str]:
    """A value as a message may spell it: as it is, and escaped as JSON or by ``repr``."""
    forms = {value, json.dumps(value)[1:-1], repr(value)[1:-1]}
    return {form for form in forms if len(form) >= MIN_SCRUBBED_LENGTH}


def scrub(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of each value replaced by ``"[redacted]"``.

    One pass, longest value first, so that one value inside another is not
    half-replaced.
    """
    forms = {form for value in values for form in _forms(value)}
    if not forms or not text:
        return text
    pattern = "|".join(re.escape(form) for form in sorted(forms, key=len, reverse=True))
    return re.sub(pattern, REDACTED, text)


# --------------------------------------------------------------------------- proposals


def redact_proposal(raw: Any, tools: ProposalRedactor) -> tuple[Any, list[str]]:
    """A rejected proposal as it may be stored, and the sensitive values found in it.

    ``raw`` is the proposal in its JSON form (a model's object, or its text). When
    no tool declares sensitive fields, it is stored as it is. The values returned
    are for :func:`scrub` (a validation problem may quote one).
    """
    if not tools.redacts:
        return raw, []
    found: list[str] = []
    return _Proposal(tools, found).decision(raw), found


class _Proposal:
    """One proposal being redacted (collects the sensitive values it met)."""

    def __init__(self, tools: ProposalRedactor, found: list[str]) -> None:
        self.tools = tools
        self.found = found

    def decision(self, raw: Any) -> Any:
        value = _parsed(raw)
        if value is _UNPARSED:
            return dropped(raw)
        if isinstance(value, _SCALAR) and not isinstance(value, str):
            return value  # a number or null holds nothing to redact
        if not isinstance(value, dict):
            return dropped(value)
        stored: dict[str, Any] = {}
        for key, item in value.items():
            if key == "calls":
                stored[key] = self.calls(item)
            elif key in _DECISION_FIELDS and isinstance(item, _SCALAR):
                stored[key] = item
            else:
                stored[key] = dropped(item)
        return stored

    def calls(self, raw: Any) -> Any:
        value = _parsed(raw)
        if not isinstance(value, list):
            return dropped(raw)
        return [self.call(item) for item in value]

    def call(self, raw: Any) -> Any:
        value = _parsed(raw)
        if not isinstance(value, dict):
            return dropped(raw)
        stored: dict[str, Any] = {}
        for key, item in value.items():
            if key == "arguments":
                stored[key] = self.arguments(value.get("name"), item)
            elif key in _CALL_FIELDS and isinstance(item, _SCALAR):
                stored[key] = item
            else:
                stored[key] = dropped(item)
        return stored

    def arguments(self, name: Any, raw: Any) -> Any:
        value = _parsed(raw)
        if not isinstance(value, dict):
            return dropped(raw)
        if not isinstance(name, str) or self.tools.effect_of(name) is None:
            # No list of sensitive fields applies to a tool the agent does not have.
            return dropped(raw)
        redacted = self.tools.redact_arguments(name, value)
        self.found.extend(redacted_values(value, redacted))
        for location in opaque_parents(value, self.tools.sensitive_arguments(name)):
            redacted = _drop_at(redacted, location, _value_at(value, location))
        for location in self._unknown_arguments(name, value):
            redacted = _drop_at(redacted, location)
        return redacted

    def _unknown_arguments(self, name: str, arguments: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Where the tool's schema refuses a field it does not have (maybe a misspelt secret)."""
        try:
            call = ToolCall(id="redacting", name=name, arguments=arguments)
        except ValidationError:
            return []
        try:
            self.tools.check_arguments(call)
        except ValidationError as error:
            return [
                tuple(item["loc"]) for item in error.errors() if item["type"] == "extra_forbidden"
            ]
        return []


_UNPARSED: Any = object()


def _parsed(raw: Any) -> Any:
    """A value, with JSON text parsed (``_UNPARSED`` when it is text but not JSON).

    Parsed with the guard of every stored value (``aggregates.values``): text that nests
    too deep, or holds NaN, ±Infinity or a lone surrogate, cannot be stored once
    parsed, so it is not parsed (and is dropped).
    """
    if not isinstance(raw, str | bytes):
        return raw
    try:
        return parse_json_text(raw)
    except ValueError:  # NotJsonError, UnstorableError
        return _UNPARSED


_HERE: Any = object()


def _drop_at(value: Any, location: tuple[Any, ...], original: Any = _HERE) -> Any:
    """A copy of ``value`` with the part at ``location`` (keys and indexes) dropped.

    ``original``: the part as the model sent it, when ``value`` holds it redacted.
    """
    if not location:
        return dropped(value if original is _HERE else original)
    head, rest = location[0], location[1:]
    if isinstance(value, dict) and head in value:
        return {**value, head: _drop_at(value[head], rest, original)}
    if isinstance(value, list) and isinstance(head, int) and 0 <= head < len(value):
        return [*value[:head], _drop_at(value[head], rest, original), *value[head + 1 :]]
    return value


def _value_at(value: Any, location: tuple[Any, ...]) -> Any:
    for part in location:
        value = value[part]
    return value
