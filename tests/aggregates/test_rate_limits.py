"""The rules of shared rate limits (``aggregates.rate_limits``): pure, times passed in.

Bad inputs tried: a limit with neither count, counts of 0, an empty provider, a
``--rate-limit`` text of three fields, with a count that is not a number, with neither
count; a request larger than the whole token limit; a ``Retry-After`` of 0; a worker's
config file with an unknown key, a ``rate_limit`` that is not tables, a limit with a
count of 0, a misspelled field and a text where a number goes.
"""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from aggregates.rate_limits import (
    Granted,
    QuotaRow,
    RateLimit,
    TooLong,
    correct,
    estimate_tokens,
    parse_rate_limit,
    rate_limits_of_config,
    take,
    throttle,
)

RPM = RateLimit(provider="p", model="m", requests_per_minute=4, window_s=1.0)
TPM = RateLimit(provider="p", model="m", tokens_per_minute=100, window_s=1.0)


def granted(verdict: Granted | TooLong) -> Granted:
    assert isinstance(verdict, Granted), verdict
    return verdict


def schedule(limit: RateLimit, count: int, *, now: float = 10.0, tokens: int = 1) -> list[float]:
    """The starts ``count`` requests made at ``now`` are given, in order."""
    row, starts = None, []
    for _ in range(count):
        verdict = granted(take(row, limit, now=now, tokens=tokens, max_wait_s=1e9))
        starts.append(verdict.start)
        row = verdict.row
    return starts


def test_the_first_request_starts_at_once() -> None:
    verdict = granted(take(None, RPM, now=10.0, tokens=5, max_wait_s=0))

    assert (verdict.start, verdict.wait_s) == (10.0, 0.0)


def test_requests_are_spread_evenly_over_the_window() -> None:
    assert schedule(RPM, 6) == [10.0, 10.25, 10.5, 10.75, 11.0, 11.25]


def test_no_window_of_the_limits_length_holds_more_than_its_requests() -> None:
    starts = schedule(RPM, 40)
    for first in starts:
        assert sum(1 for s in starts if first <= s < first + RPM.window_s) <= 4


def test_tokens_pace_requests_by_what_they_reserve() -> None:
    assert schedule(TPM, 3, tokens=50) == [10.0, 10.5, 11.0]


def test_a_request_larger_than_the_token_limit_reserves_the_whole_window() -> None:
    verdict = granted(take(None, TPM, now=0.0, tokens=10_000, max_wait_s=0))

    assert verdict.tokens == 100
    assert verdict.row.token_due == 1.0


def test_a_start_past_the_wait_allowed_takes_nothing() -> None:
    row = QuotaRow(request_due=15.0)

    verdict = take(row, RPM, now=10.0, tokens=1, max_wait_s=2.0)

    assert verdict == TooLong(until=15.0, wait_s=5.0)


def test_the_usage_of_a_reply_corrects_the_tokens_it_reserved() -> None:
    first = granted(take(None, TPM, now=0.0, tokens=50, max_wait_s=0))

    more = correct(first.row, TPM, 30)
    fewer = correct(first.row, TPM, -40)
    after = granted(take(fewer, TPM, now=0.0, tokens=50, max_wait_s=1))

    assert more.token_due == pytest.approx(0.8)
    assert fewer.token_due == pytest.approx(0.1)
    assert after.start == pytest.approx(0.1)
    assert correct(first.row, RPM, 30) == first.row  # no token limit: nothing to correct


def test_a_rate_limited_answer_blocks_everyone_until_its_retry_after() -> None:
    row = throttle(None, RPM, now=10.0, retry_after_s=3.0)

    verdict = granted(take(row, RPM, now=10.5, tokens=1, max_wait_s=60))

    assert verdict.start == 13.0


def test_a_rate_limited_answer_without_retry_after_blocks_for_a_second() -> None:
    row = throttle(None, RPM, now=10.0, retry_after_s=0)

    assert row.blocked_until == 11.0


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"requests_per_minute": 0},
        {"tokens_per_minute": 0},
        {"requests_per_minute": 1, "window_s": 0},
        {"requests_per_minute": 1, "provider": ""},
    ],
)
def test_a_malformed_limit_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RateLimit(**{"provider": "p", "model": "m", **fields})


def test_a_limit_is_written_provider_model_rpm_tpm() -> None:
    assert parse_rate_limit("openai:gpt-4o:500:-") == RateLimit(
        provider="openai", model="gpt-4o", requests_per_minute=500
    )
    assert parse_rate_limit("anthropic:claude:50:40000").tokens_per_minute == 40000


@pytest.mark.parametrize("text", ["openai:gpt:500", "openai:gpt:x:-", "openai:gpt:-:-", "a:b:0:1"])
def test_a_malformed_limit_text_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"rate limit|whole number|requests_per_minute"):
        parse_rate_limit(text)


def test_a_request_is_estimated_at_a_token_for_four_characters() -> None:
    assert (estimate_tokens(0), estimate_tokens(4), estimate_tokens(5)) == (1, 1, 2)


def test_a_config_file_s_rate_limit_tables_are_limits() -> None:
    document = {
        "rate_limit": [
            {"provider": "openai", "model": "gpt-4o", "requests_per_minute": 500},
            {
                "provider": "anthropic",
                "model": "claude",
                "tokens_per_minute": 200_000,
                "max_wait_s": 5,
            },
        ]
    }
    assert rate_limits_of_config(document) == [
        RateLimit(provider="openai", model="gpt-4o", requests_per_minute=500),
        RateLimit(provider="anthropic", model="claude", tokens_per_minute=200_000, max_wait_s=5),
    ]
    assert rate_limits_of_config({}) == []


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"rate_limits": []}, "unknown key(s) rate_limits"),
        ({"rate_limit": {"provider": "p"}}, "rate_limit must be tables"),
        (
            {"rate_limit": [{"provider": "p", "model": "m", "requests_per_minute": 0}]},
            "number 1: requests_per_minute: Input should be greater than or equal to 1",
        ),
        (
            {"rate_limit": [{"provider": "p", "model": "m", "requests_per_minut": 5}]},
            "requests_per_minut: Extra inputs are not permitted",
        ),
        (
            {"rate_limit": [RPM.model_dump(), {"provider": "p", "model": "m", "window_s": "x"}]},
            "number 2: ",
        ),
    ],
)
def test_a_config_file_that_is_not_limits_says_where(
    document: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        rate_limits_of_config(document)
