"""What a value must be to be stored faithfully, checked once, where it enters.

A value from outside (a model's proposal or usage, a tool's output, a service's
receipt) is stored as JSON and read back by pydantic's JSON reader, hashed into the
audit chain, and shown to the model again. It is stored only if it survives all of
that unchanged, and is refused where it enters otherwise (a typed rejection, an
``output_invalid`` error, a service that did not answer) — never stored in another
form. Every check is here, pure, so that the core (``aggregates.turn``) and the
shell (``loop_actors``) apply the same rule.

A JSON value is storable when it is made of ``dict`` (``str`` keys), ``list``,
``str``, ``int``, ``float``, ``bool`` and ``None`` only, and

* every float is finite (NaN and ±Infinity have no JSON form: they were stored as
  ``null`` while the audit hash was computed over NaN);
* every integer fits in 64 signed bits (:data:`MAX_JSON_INT`: SQLite and most JSON
  readers cannot hold more);
* no string (key or value) holds a lone UTF-16 surrogate (it cannot be encoded as
  UTF-8, so it cannot be written at all);
* containers nest at most :data:`MAX_JSON_DEPTH` levels (the store's JSON reader stops
  at 200; the cap leaves room for the event around the value);
* it holds at most :data:`MAX_JSON_VALUES` values in all (a shared sub-list counts each
  time it is reached: that is how often it is written).

Sizes are the UTF-8 length of the value's compact JSON text. What is over a size
limit is not refused but replaced, visibly, by :func:`truncated`: what was cut, its
size and its SHA-256, and the first characters of its text.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import reprlib
from typing import Any

MAX_JSON_DEPTH = 64
"""The deepest nesting of lists and objects a stored value may have."""

MAX_JSON_INT = 2**63 - 1
"""The largest integer (in absolute value, ``-MAX_JSON_INT - 1`` too) a stored value may hold."""

MAX_JSON_VALUES = 10_000_000
"""The most values (scalars and containers) one stored value may hold."""

DEFAULT_MAX_OUTPUT_BYTES = 1_000_000
"""The default ``max_output_bytes``: the largest tool output or receipt stored whole (1 MB)."""

DEFAULT_MAX_PROPOSAL_BYTES = 256_000
"""The default ``max_proposal_bytes``: the largest model proposal accepted (256 KB)."""

TRUNCATED_HEAD_CHARS = 2_000
"""The most characters of a truncated value's text kept in its ``head``."""

MAX_MESSAGE_CHARS = 4_000
"""The most characters of an error text (a tool's exception, a service's reason) kept."""

MAX_TOKENS = 2**53
"""The most tokens one model call may report (input or output)."""

MAX_COST = 1e12
"""The highest cost one model call may report."""

MAX_LATENCY_MS = 1e12
"""The longest latency (ms) one model call may report."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_MIN_INT = -MAX_JSON_INT - 1


# --------------------------------------------------------------------------- texts


def check_text(text: str) -> str | None:
    """Why ``text`` cannot be stored (a lone surrogate), or None when it can."""
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return f"a lone surrogate U+{ord(found.group()):04X} at character {found.start()}"


def safe_text(value: object, *, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``str(value)`` as storable text: for error messages, never for values that ran.

    A ``__str__`` that raises gives a note instead; lone surrogates are written as
    backslash escapes; text over ``limit`` characters is cut, with a note of its length.
    """
    if isinstance(value, str) and type(value) is str:
        text = value
    else:
        try:
            text = str(value)
            if type(text) is not str:  # a __str__ that returns a str subclass
                text = str.__str__(text)
        except BaseException as error:  # user code: any failure is a note
            text = f"<str() raised {type(error).__name__}>"
    if check_text(text) is not None:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text)} characters)"
    return text


def describe_error(error: BaseException) -> str:
    """An exception as storable text: ``Type: message`` (see :func:`safe_text`)."""
    message = safe_text(error)
    name = safe_text(type(error).__name__, limit=200)
    return f"{name}: {message}" if message else name


# --------------------------------------------------------------------------- JSON values


def check_json(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``value`` cannot be stored faithfully as JSON, or None when it can (see the module).

    The problem names where it is, e.g. ``calls.0.arguments.x: NaN is not a finite number``.
    Iterative: any depth, and cycles (which nest without end), are refused, not a crash.
    """
    if storable_bound(value, max_depth=max_depth) is not None:
        return None
    return _locate(value, max_depth)


STR_BOUND_PER_CHAR = 6
"""The most UTF-8 bytes one character of a string takes in compact JSON (``\\u001f``)."""

INT_BOUND = 20
"""The longest JSON text of an integer in the 64-bit range (``-9223372036854775808``)."""

FLOAT_BOUND = 24
"""The longest JSON text (``repr``) of a finite float (``-2.2250738585072014e-308``)."""


def storable_bound(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> int | None:
    """None when ``value`` cannot be stored faithfully, else a bound of its :func:`json_size`.

    The same rule as :func:`check_json` (which says why, and where), in one pass
    that also adds up an upper bound of the UTF-8 size of the value's compact JSON
    text: a string of n characters takes at most ``6n + 2`` bytes, an integer
    :data:`INT_BOUND`, a float :data:`FLOAT_BOUND`, ``true``/``false``/``null`` 5,
    a container 2 plus a separator per member (and a colon per key). A value whose
    bound is within a size limit is within it: it need not be encoded to know
    (:func:`limit_size`'s ``bound``).

    Iterative: any depth, and cycles (which nest without end), are refused, not a crash.
    """
    kind = type(value)
    if kind is str:
        if not value.isascii() and _SURROGATE.search(value):
            return None
        return STR_BOUND_PER_CHAR * len(value) + 2
    if kind is not dict and kind is not list:
        return _scalar_bound(value, kind)
    size = 0
    left = MAX_JSON_VALUES - 1  # the values not yet reached that may still be
    stack: list[tuple[Any, int]] = [(value, 0)]
    push, pop = stack.append, stack.pop
    while stack:
        item, depth = pop()
        if depth >= max_depth:
            return None
        count = len(item)
        left -= count
        if left < 0:
            return None
        size += 2 + 2 * count
        members: Any
        if type(item) is dict:
            for key in item:
                if type(key) is not str or (not key.isascii() and _SURROGATE.search(key)):
                    return None
                size += STR_BOUND_PER_CHAR * len(key) + 2
            members = item.values()
        else:
            members = item
        # Scalars are checked here, without a trip through the stack: most values are.
        for member in members:
            kind = type(member)
            if kind is str:
                if not member.isascii() and _SURROGATE.search(member):
                    return None
                size += STR_BOUND_PER_CHAR * len(member) + 2
            elif kind is dict or kind is list:
                push((member, depth + 1))
            elif kind is int:
                if not _MIN_INT <= member <= MAX_JSON_INT:
                    return None
                size += INT_BOUND
            elif kind is bool or member is None:
                size += 5
            elif kind is float:
                if not math.isfinite(member):
                    return None
                size += FLOAT_BOUND
            else:
                return None
    return size


def _scalar_bound(value: Any, kind: type) -> int | None:
    if kind is int:
        return INT_BOUND if _MIN_INT <= value <= MAX_JSON_INT else None
    if kind is float:
        return FLOAT_BOUND if math.isfinite(value) else None
    if value is None or kind is bool:
        return 5
    return None


def _locate(value: Any, max_depth: int) -> str:
    """The slow check, run only once a value failed the fast one: where, and what."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 0, ())]
    left = MAX_JSON_VALUES - 1  # as storable_bound counts: every value reached
    while stack:
        item, depth, path = stack.pop()
        problem = _scalar_problem(item)
        if isinstance(item, dict | list) and type(item) in (dict, list):
            left -= len(item)
            if depth >= max_depth:
                problem = f"nested deeper than {max_depth} levels"
            elif left < 0:
                problem = f"more than {MAX_JSON_VALUES} values"
            elif type(item) is dict:
                for key, member in reversed(item.items()):
                    if type(key) is not str:
                        return f"{_where(path)}: a key of type {type(key).__name__} is not a string"
                    text = check_text(key)
                    if text is not None:
                        return f"{_where((*path, key))}: the key holds {text}"
                    stack.append((member, depth + 1, (*path, key)))
            else:
                stack.extend(
                    (member, depth + 1, (*path, index))
                    for index, member in reversed(list(enumerate(item)))
                )
        if problem is not None:
            return f"{_where(path)}: {problem}"
    return "the value is not storable"  # pragma: no cover - storable_bound said it was not


def _scalar_problem(item: Any) -> str | None:
    kind = type(item)
    if kind is str:
        text = check_text(item)
        return None if text is None else f"the string holds {text}"
    if kind is int:
        if not _MIN_INT <= item <= MAX_JSON_INT:
            return "an integer outside the signed 64-bit range"
        return None
    if kind is float:
        return None if math.isfinite(item) else f"{item!r} is not a finite number"
    if item is None or kind in (bool, dict, list):
        return None
    return f"a {safe_text(kind.__name__, limit=100)} is not a JSON value"


def _where(path: tuple[Any, ...]) -> str:
    if not path:
        return "the value"
    shown = ".".join(safe_text(part, limit=40) for part in path[:8])
    return shown if len(path) <= 8 else f"{shown}… ({len(path)} levels)"


_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


def json_text(value: Any) -> str:
    """The compact JSON text of a storable value (the text its size is measured on)."""
    return _COMPACT.encode(value)


def json_size(value: Any) -> int:
    """The UTF-8 size of a storable value's compact JSON text."""
    text = json_text(value)
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def truncated(text: str | bytes, *, max_bytes: int, head: bool = True) -> dict[str, Any]:
    """What is stored instead of a value over its size limit: a typed, visible stand-in.

    ``{"truncated": true, "size": N, "sha256": "...", "head": "<first characters>"}``:
    ``size`` and ``sha256`` are of the whole text's UTF-8 bytes (or of the bytes
    given); ``head`` is its first ``min(TRUNCATED_HEAD_CHARS, max_bytes // 8)``
    characters, left out with ``head=False`` (text that could not be redacted).
    """
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    marker: dict[str, Any] = {
        "truncated": True,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    if head:
        shown = text if isinstance(text, str) else data.decode("utf-8", "replace")
        piece = shown[: max(0, min(TRUNCATED_HEAD_CHARS, max_bytes // 8))]
        marker["head"] = safe_text(piece, limit=TRUNCATED_HEAD_CHARS)
    return marker


def limit_size(value: Any, *, max_bytes: int, bound: int | None = None) -> tuple[Any, bool]:
    """A storable value, or its :func:`truncated` stand-in when its JSON is over ``max_bytes``.

    ``bound``: the value's :func:`storable_bound`, when known: within ``max_bytes``,
    the value is not encoded to be measured.

    Returns the value to store and whether it was truncated.
    """
    if value is None or type(value) in (bool, int, float):
        return value, False
    if bound is not None and bound <= max_bytes:
        return value, False
    if type(value) is str and len(value) * 4 + 2 <= max_bytes:
        return value, False  # cannot be over the limit: no need to encode it
    text = json_text(value)
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size <= max_bytes:
        return value, False
    return truncated(text, max_bytes=max_bytes), True


_REPR = reprlib.Repr()
_REPR.maxlevel = 6
_REPR.maxstring = 200
_REPR.maxother = 200
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 20


def unstorable(value: Any, problem: str, *, show: bool = True) -> dict[str, Any]:
    """What is stored instead of a value that cannot be stored faithfully (never ``null``).

    ``{"unstorable": true, "problem": "...", "size": N, "sha256": "...", "repr": "..."}``:
    for text or bytes, ``size`` and ``sha256`` are of its exact UTF-8 bytes (lone
    surrogates as they are); for any other object, of the bounded ``repr`` that is
    kept (nested containers and long strings abbreviated). ``show=False`` leaves the
    ``repr`` out (a value that could not be redacted).
    """
    if isinstance(value, str | bytes):
        data = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
        shown = safe_text(_REPR.repr(value), limit=TRUNCATED_HEAD_CHARS)
    else:
        shown = safe_text(_bounded_repr(value), limit=TRUNCATED_HEAD_CHARS)
        data = shown.encode("utf-8")
    substitute: dict[str, Any] = {
        "unstorable": True,
        "problem": safe_text(problem),
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    if show:
        substitute["repr"] = shown
    return substitute


def _bounded_repr(value: Any) -> str:
    try:
        return _REPR.repr(value)
    except BaseException as error:  # user code: any failure is a note
        return f"<repr() raised {type(error).__name__}>"


# --------------------------------------------------------------------------- JSON text


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def check_json_depth(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why JSON text nests too deep to be parsed safely, or None (strings are skipped)."""
    if text.count("[") + text.count("{") <= max_depth:
        return None  # cannot nest deeper than it has brackets
    depth = 0
    for token in _STRUCTURE.finditer(text):
        mark = token.group()
        if mark in ("[", "{"):
            depth += 1
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels at character {token.start()}"
        elif mark in ("]", "}"):
            depth -= 1
    return None


class NotJsonError(ValueError):
    """Raised when a text is not JSON at all (its syntax)."""


class UnstorableError(ValueError):
    """Raised when a text is JSON whose value cannot be stored faithfully."""


def parse_json_text(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse untrusted JSON text into a storable value (never a ``RecursionError``).

    The nesting is checked on the text before it is parsed; NaN, ±Infinity (also
    ``1e400``), lone surrogates (also as JSON escapes) and integers out of
    range are refused after.

    Raises:
        NotJsonError: the text is not JSON.
        UnstorableError: it is, but its value cannot be stored (the message says why).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UnstorableError(f"not UTF-8: {error.reason} at byte {error.start}") from None
    problem = check_text(text) or check_json_depth(text, max_depth=max_depth)
    if problem is not None:
        raise UnstorableError(problem)
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise NotJsonError(str(error)) from None
    except ValueError as error:  # a constant refused by _refuse_constant
        raise UnstorableError(str(error)) from None
    except RecursionError:  # pragma: no cover - the depth is checked above
        raise UnstorableError(f"nested deeper than {max_depth} levels") from None
    problem = check_json(value, max_depth=max_depth)
    if problem is not None:
        raise UnstorableError(problem)
    return value


# --------------------------------------------------------------------------- usage


def usage_problem(usage: Any) -> str | None:
    """Why a model's reported usage cannot be recorded, or None when it can.

    Tokens must be integers in ``[0, MAX_TOKENS]``; cost and latency finite numbers in
    ``[0, MAX_COST]`` / ``[0, MAX_LATENCY_MS]``; attempts absent or a positive integer.
    A negative figure would pay budgets back; a non-finite one cannot be stored.
    """
    # The usual case in one expression (NaN and the infinities fail the range tests);
    # any doubt goes to the checks below, which say what is wrong.
    tokens_in: Any = getattr(usage, "input_tokens", None)
    tokens_out: Any = getattr(usage, "output_tokens", None)
    cost: Any = getattr(usage, "cost", None)
    latency: Any = getattr(usage, "latency_ms", None)
    attempts: Any = getattr(usage, "attempts", None)
    if (
        type(tokens_in) is int
        and type(tokens_out) is int
        and type(cost) in (int, float)
        and type(latency) in (int, float)
        and 0 <= tokens_in <= MAX_TOKENS
        and 0 <= tokens_out <= MAX_TOKENS
        and 0 <= cost <= MAX_COST
        and 0 <= latency <= MAX_LATENCY_MS
        and (attempts is None or (type(attempts) is int and 0 <= attempts <= 2**31))
    ):
        return None
    problems = []
    for name, limit in (("input_tokens", MAX_TOKENS), ("output_tokens", MAX_TOKENS)):
        figure = getattr(usage, name, None)
        if type(figure) is not int or not 0 <= figure <= limit:
            problems.append(f"{name} must be an integer from 0 to {limit}, got {_figure(figure)}")
    for name, bound in (("cost", MAX_COST), ("latency_ms", MAX_LATENCY_MS)):
        figure = getattr(usage, name, None)
        if type(figure) not in (int, float) or not (
            math.isfinite(figure) and 0 <= figure <= bound  # type: ignore[arg-type, operator]
        ):
            problems.append(
                f"{name} must be a finite number from 0 to {bound:g}, got {_figure(figure)}"
            )
    if attempts is not None and (type(attempts) is not int or not 0 <= attempts <= 2**31):
        problems.append(f"attempts must be a positive integer, got {_figure(attempts)}")
    return "; ".join(problems) or None


def _figure(value: Any) -> str:
    return safe_text(_bounded_repr(value), limit=60)
