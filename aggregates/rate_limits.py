"""Provider rate limits shared by every run and worker: the rules, without I/O or clock.

A :class:`RateLimit` bounds the requests and the tokens a ``(provider, model)`` may be
sent per window (a minute by default). Its state is one :class:`QuotaRow` in the store,
which every process of the store updates in a short transaction; this module says what
each update is, given the row, the limit and the store's time.

The rule is a paced schedule (GCRA, the "virtual scheduling" form of a token bucket
with no burst): each request starts no earlier than ``request_due`` (the previous
request's start plus ``window / requests``), and no earlier than ``token_due`` (the
previous requests' tokens, at ``window / tokens`` seconds a token). A request takes the
earliest start it may have and moves both times on: so the requests of many runs and
workers are handed out in order, spread over the window, and in any window of the
limit's length no more than ``requests_per_minute`` start. A provider's ``Retry-After``
(or its ``rate_limited`` answer) blocks the limit for everyone until then.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, ValidationError, model_validator

from aggregates.decisions import Frozen

WINDOW_S = 60.0
"""The window the limits count over: a minute."""

DEFAULT_MAX_WAIT_S = 60.0
"""How long a model call waits for quota at most before its run pauses ``rate_limited``."""

CHARS_PER_TOKEN = 4
"""The estimate of a request's tokens: its characters divided by this (corrected later)."""


class RateLimit(Frozen):
    """What a provider allows one model: requests and tokens a minute (either or both).

    ``window_s`` is the length of the window the limits count over (60: a minute;
    shorter ones are for tests). ``max_wait_s``: how long a model call waits for quota
    at most; a longer wait pauses the run ``rate_limited`` until the quota is there.
    """

    provider: Annotated[str, Field(min_length=1, max_length=200)]
    model: Annotated[str, Field(min_length=1, max_length=200)]
    requests_per_minute: Annotated[int, Field(ge=1)] | None = None
    tokens_per_minute: Annotated[int, Field(ge=1)] | None = None
    window_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = WINDOW_S
    max_wait_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = DEFAULT_MAX_WAIT_S

    @model_validator(mode="after")
    def _limits_something(self) -> RateLimit:
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise ValueError("a rate limit needs requests_per_minute or tokens_per_minute")
        return self

    @property
    def key(self) -> tuple[str, str]:
        """Its ``(provider, model)``: one row in the store."""
        return (self.provider, self.model)

    @property
    def request_interval_s(self) -> float:
        """Seconds between the starts of two requests (0 without a request limit)."""
        rpm = self.requests_per_minute
        return 0.0 if rpm is None else self.window_s / rpm

    def token_interval_s(self, tokens: int) -> float:
        """Seconds ``tokens`` occupy of the token limit (0 without one)."""
        tpm = self.tokens_per_minute
        return 0.0 if tpm is None else min(tokens, tpm) * self.window_s / tpm


def parse_rate_limit(text: str) -> RateLimit:
    """A limit written ``provider:model:rpm:tpm`` (``-`` or empty for no limit of a kind).

    Raises:
        ValueError: it is not four fields, a count is not a whole number of at least 1,
            or neither count is given.
    """
    parts = text.split(":")
    if len(parts) != 4:
        raise ValueError(f"a rate limit is provider:model:rpm:tpm, got {text!r}")
    provider, model, rpm, tpm = parts

    def count(field: str, value: str) -> int | None:
        if value in ("", "-"):
            return None
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{field} must be a whole number of at least 1, got {value!r}")
        return int(value)

    return RateLimit(
        provider=provider,
        model=model,
        requests_per_minute=count("rpm", rpm),
        tokens_per_minute=count("tpm", tpm),
    )


CONFIG_TABLE = "rate_limit"
"""A worker's config file holds its limits as ``[[rate_limit]]`` tables."""


def rate_limits_of_config(document: Mapping[str, Any]) -> list[RateLimit]:
    """The limits of a worker's parsed config file (TOML): its ``[[rate_limit]]`` tables.

    Each table has the fields of :class:`RateLimit` (``provider``, ``model``,
    ``requests_per_minute``, ``tokens_per_minute``, ``window_s``, ``max_wait_s``).

    Raises:
        ValueError: a key the file may not have, a ``rate_limit`` that is not a list of
            tables, or a table that is not a valid limit (which one, and why).
    """
    unknown = sorted(set(document) - {CONFIG_TABLE})
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}: the file holds [[{CONFIG_TABLE}]]")
    tables = document.get(CONFIG_TABLE, [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ValueError(f"{CONFIG_TABLE} must be tables, written [[{CONFIG_TABLE}]]")
    limits = []
    for number, table in enumerate(tables, start=1):
        try:
            limits.append(RateLimit.model_validate(table, strict=False))
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in e['loc']) or 'limit'}: {e['msg']}"
                for e in error.errors()
            )
            raise ValueError(f"[[{CONFIG_TABLE}]] number {number}: {problems}") from None
    return limits


def estimate_tokens(characters: int) -> int:
    """A request's tokens as reserved before it is sent (its reply's usage corrects it)."""
    return max(1, math.ceil(characters / CHARS_PER_TOKEN))


class QuotaRow(Frozen):
    """The shared state of one limit (seconds since the epoch, by the store's clock)."""

    request_due: float = 0.0
    """The earliest start of the next request."""
    token_due: float = 0.0
    """When the tokens reserved so far have passed."""
    blocked_until: float = 0.0
    """The provider said to wait until then (``Retry-After``, or a ``rate_limited`` answer)."""


class Granted(Frozen):
    """The request may start at ``start`` (``wait_s`` from now); ``row`` is written."""

    start: float
    wait_s: float
    tokens: int
    """The tokens reserved for it."""
    row: QuotaRow


class TooLong(Frozen):
    """The request could not start before ``until``, past the wait allowed: nothing is taken."""

    until: float
    wait_s: float


def take(
    row: QuotaRow | None, limit: RateLimit, *, now: float, tokens: int, max_wait_s: float
) -> Granted | TooLong:
    """Schedule one request of ``tokens`` estimated tokens: its start, and the row after it.

    A start more than ``max_wait_s`` away takes nothing (the run pauses instead).
    """
    row = row or QuotaRow()
    start = max(now, row.blocked_until, row.request_due, row.token_due)
    if start - now > max_wait_s:
        return TooLong(until=start, wait_s=start - now)
    reserved = min(tokens, limit.tokens_per_minute or tokens)
    after = QuotaRow(
        request_due=start + limit.request_interval_s,
        token_due=start + limit.token_interval_s(reserved),
        blocked_until=row.blocked_until,
    )
    return Granted(start=start, wait_s=start - now, tokens=reserved, row=after)


def correct(row: QuotaRow, limit: RateLimit, tokens: int) -> QuotaRow:
    """Move ``token_due`` by ``tokens`` more (or, negative, fewer) than were reserved.

    For corrections a process gathers and applies with its next request of the limit
    (one transaction a request instead of two); a time before now counts as now.
    """
    if limit.tokens_per_minute is None or not tokens:
        return row
    shift = tokens * limit.window_s / limit.tokens_per_minute
    return row.model_copy(update={"token_due": row.token_due + shift})


def throttle(
    row: QuotaRow | None, limit: RateLimit, *, now: float, retry_after_s: float | None
) -> QuotaRow:
    """The provider refused a request as over its limit: block the limit for everyone.

    Until ``now + retry_after_s`` when it said, else for one request interval (at least
    a second); no request of any run or worker starts before.
    """
    row = row or QuotaRow()
    pause = retry_after_s if retry_after_s is not None and retry_after_s > 0 else None
    until = now + (pause if pause is not None else max(1.0, limit.request_interval_s))
    blocked = max(row.blocked_until, until)
    return QuotaRow(
        request_due=max(row.request_due, blocked),
        token_due=row.token_due,
        blocked_until=blocked,
    )
