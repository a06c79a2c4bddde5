"""Provider rate limits shared by the runs of a Runtime through its store (real time, short).

A fake provider (``tests/support/quota_provider.py``) serves N requests a window and
refuses the next with HTTP 429, counting it. Windows are a second or two here (the
limit's ``window_s``), so each test takes a few seconds.

Bad inputs tried: a burst of runs with a retry budget of one attempt (and, without the
shared limit, the same burst: refused); a provider stricter than the limit it was given
(its 429s block the limit for everyone); a wait past ``max_wait_s``; a wait past the
run's deadline; a cancel during a wait; something that is not a ``RateLimit`` and two
limits of one model given to the Runtime.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from aggregates.decisions import Budget
from loop_actors import Agent, RateLimit, RetryPolicy, Runtime, TerminalReason, UsageError
from loop_actors.runtime.outcome import Outcome
from tests.support.quota_provider import MODEL, PROVIDER, LimitedModel, LimitedService

LIMIT, WINDOW_S = 4, 1.0
PACED = 3
"""The limit the runtime is given: a little under the provider's ``LIMIT``, as the how-to
says (a request is sent when its task wakes, a little after its scheduled start: at the
provider's exact limit a late one and an on-time one can share one of its windows)."""


def limit(**fields: float) -> RateLimit:
    values: dict[str, float] = {"requests_per_minute": PACED, "window_s": WINDOW_S, **fields}
    return RateLimit(provider=PROVIDER, model=MODEL, **values)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'events.db'}"


@pytest.fixture
def service(tmp_path: Path) -> LimitedService:
    return LimitedService(tmp_path / "provider.db", limit=LIMIT, window_s=WINDOW_S)


async def run_all(runtime: Runtime, agent: Agent, count: int) -> list[Outcome]:
    outcomes: list[Outcome] = []

    async def one(n: int) -> None:
        outcomes.append(await runtime.run(agent, f"goal {n}", invocation_id=f"r-{n}"))

    async with trio.open_nursery() as nursery:
        for n in range(count):
            nursery.start_soon(one, n)
    return outcomes


async def test_many_runs_in_one_process_stay_under_the_providers_limit(
    db: str, service: LimitedService
) -> None:
    agent = Agent("limited", LimitedModel(service, retry=RetryPolicy(max_attempts=1)), [])
    with trio.fail_after(60):
        async with Runtime(db, rate_limits=[limit()]) as runtime:
            outcomes = await run_all(runtime, agent, 12)
            stats = runtime.statistics().quota
            assert stats is not None

    assert {o.reason for o in outcomes} == {TerminalReason.COMPLETED}
    assert service.counts() == (12, 0)  # none over the limit: no 429 at all
    assert service.most_in_a_window() <= LIMIT
    assert stats.granted == 12
    assert stats.waited >= 12 - PACED


async def test_without_a_shared_limit_the_same_burst_is_refused_by_the_provider(
    db: str, service: LimitedService
) -> None:
    """The control: what the shared limit prevents."""
    agent = Agent("limited", LimitedModel(service, retry=RetryPolicy(max_attempts=1)), [])
    with trio.fail_after(60):
        async with Runtime(db) as runtime:
            outcomes = await run_all(runtime, agent, 12)

    assert TerminalReason.MODEL_ERROR in {o.reason for o in outcomes}
    assert service.counts()[1] > 0


async def test_a_rate_limited_answer_blocks_the_limit_for_every_run(
    db: str, tmp_path: Path
) -> None:
    strict = LimitedService(tmp_path / "strict.db", limit=2, window_s=WINDOW_S)
    agent = Agent("limited", LimitedModel(strict, retry=RetryPolicy(max_attempts=6)), [])
    with trio.fail_after(60):
        async with Runtime(db, rate_limits=[limit(requests_per_minute=20)]) as runtime:
            outcomes = await run_all(runtime, agent, 6)
            assert runtime.quota is not None
            stats = runtime.quota.statistics()

    assert {o.reason for o in outcomes} == {TerminalReason.COMPLETED}
    served, refused = strict.counts()
    assert served == 6
    assert stats.throttled == refused >= 1
    assert refused <= 4  # each refusal held every run back: no storm of retries


async def test_a_wait_past_max_wait_pauses_the_run_rate_limited_until_the_quota(
    db: str, service: LimitedService
) -> None:
    agent = Agent("limited", LimitedModel(service), [])
    slow = limit(requests_per_minute=1, window_s=2.0, max_wait_s=0.5)
    with trio.fail_after(60):
        async with Runtime(db, rate_limits=[slow]) as runtime:
            outcomes = await run_all(runtime, agent, 3)
            paused = [o for o in outcomes if o.paused]
            resumed = [
                await runtime.resume_when_due(o.invocation_id, agent)
                for o in sorted(paused, key=lambda o: o.invocation_id)
            ]
            history = await runtime.history(paused[0].invocation_id)

    assert sorted(o.reason for o in outcomes) == sorted(
        [TerminalReason.COMPLETED, TerminalReason.RATE_LIMITED, TerminalReason.RATE_LIMITED]
    )
    assert all(o.wake_at is not None for o in paused)
    assert {o.reason for o in resumed} == {TerminalReason.COMPLETED}
    assert all(o.steps == 1 for o in resumed)  # the wait burnt no step
    assert "Terminated" in [type(e).__name__ for e in history]
    assert service.counts()[1] == 0


async def test_a_wait_for_quota_is_bounded_by_the_runs_deadline(
    db: str, service: LimitedService
) -> None:
    first = Agent("limited", LimitedModel(service), [])
    hurried = Agent("limited", LimitedModel(service), [], budget=Budget(deadline_s=1))
    slow = limit(requests_per_minute=1, window_s=30.0)
    with trio.fail_after(20):
        async with Runtime(db, rate_limits=[slow]) as runtime:
            await runtime.run(first, "first")
            outcome = await runtime.run(hurried, "second")

    assert outcome.reason is TerminalReason.DEADLINE_EXCEEDED


async def test_a_cancel_interrupts_the_wait_for_quota(db: str, service: LimitedService) -> None:
    agent = Agent("limited", LimitedModel(service), [])
    slow = limit(requests_per_minute=1, window_s=30.0)
    outcomes: list[Outcome] = []
    with trio.fail_after(20):
        async with Runtime(db, rate_limits=[slow]) as runtime:
            await runtime.run(agent, "first")

            async def second() -> None:
                outcomes.append(await runtime.run(agent, "second", invocation_id="waits"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(second)
                await trio.sleep(0.5)  # it waits 30 s for its quota
                assert "waits" in runtime.running
                assert runtime.cancel("waits", detail="not needed")

    [outcome] = outcomes
    assert outcome.reason is TerminalReason.CANCELLED
    assert service.counts() == (1, 0)


def test_the_runtime_refuses_what_is_not_a_rate_limit_and_two_limits_of_one_model() -> None:
    with pytest.raises(UsageError, match="RateLimit"):
        Runtime("memory://", rate_limits=["openai:gpt:1:1"])  # type: ignore[list-item]
    with pytest.raises(UsageError, match="two rate limits"):
        Runtime("memory://", rate_limits=[limit(), limit()])
