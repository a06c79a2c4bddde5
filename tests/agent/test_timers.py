"""Timed waits on one deadline (loop_actors._timers): the waits of trio.sleep, woken without raising.

Bad input tried: a negative, a NaN and an infinite length; a sleep of 0; a sleeper
cancelled while others wait; an earlier sleeper arriving while the timer waits for a later
one; thousands of sleepers cancelled (the heap does not keep them).
"""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from loop_actors._timers import sleep, timers


async def test_a_sleep_ends_when_its_time_has_come_and_not_before(
    clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    with trio.fail_after(60):
        await sleep(2.5)
    assert trio.current_time() - start == pytest.approx(2.5)


async def test_many_sleepers_wake_in_the_order_of_their_times(
    clock: trio.testing.MockClock,
) -> None:
    woke: list[tuple[float, float]] = []
    start = trio.current_time()

    async def nap(seconds: float) -> None:
        await sleep(seconds)
        woke.append((seconds, trio.current_time() - start))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for seconds in (3.0, 1.0, 2.0, 1.0, 0.5):
                nursery.start_soon(nap, seconds)
    assert [seconds for seconds, _ in woke] == [0.5, 1.0, 1.0, 2.0, 3.0]
    for seconds, waited in woke:
        assert waited == pytest.approx(seconds)


async def test_an_earlier_sleeper_arriving_later_is_not_kept_waiting_for_a_later_one(
    clock: trio.testing.MockClock,
) -> None:
    woke: list[str] = []
    start = trio.current_time()

    async def nap(name: str, seconds: float) -> None:
        await sleep(seconds)
        woke.append(f"{name}@{trio.current_time() - start:.1f}")

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(nap, "late", 10.0)
            await trio.testing.wait_all_tasks_blocked()  # the timer now waits for 10 s
            nursery.start_soon(nap, "early", 1.0)
    assert woke == ["early@1.0", "late@10.0"]


async def test_a_cancelled_sleeper_stops_at_once_and_the_others_still_wake(
    clock: trio.testing.MockClock,
) -> None:
    woke: list[float] = []
    start = trio.current_time()

    async def nap(seconds: float) -> None:
        await sleep(seconds)
        woke.append(trio.current_time() - start)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(nap, 5.0)
            with trio.move_on_after(1.0) as scope:
                await sleep(3.0)
            assert scope.cancelled_caught
            assert trio.current_time() - start == pytest.approx(1.0)
    assert woke == [pytest.approx(5.0)]


async def test_a_sleep_of_zero_is_a_checkpoint_and_bad_lengths_are_refused() -> None:
    with trio.fail_after(5):
        with trio.CancelScope() as scope:
            scope.cancel()
            await sleep(0)  # a checkpoint: the cancellation is delivered here
            pytest.fail("sleep(0) is not a checkpoint")  # pragma: no cover
        for bad in (-1.0, math.nan):
            with pytest.raises(ValueError, match="non-negative"):
                await sleep(bad)


async def test_an_endless_sleep_waits_until_it_is_cancelled(
    clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        with trio.move_on_after(100.0) as scope:
            await sleep(math.inf)
    assert scope.cancelled_caught


async def test_cancelled_sleepers_do_not_stay_in_the_heap(
    clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            for _ in range(5_000):
                nursery.start_soon(sleep, 1_000.0)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        await sleep(1.0)  # the timer task runs again: it drops what was cancelled
    assert len(timers()._heap) == 0
