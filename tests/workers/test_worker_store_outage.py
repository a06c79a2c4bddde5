"""A worker whose store cannot be used backs off, says so once, and claims again when it works.

Bad inputs tried: a queue whose claims fail eight times in a row (the server gone),
then answer; the same with ``until_idle``, which must not take an outage for an empty
queue. The real server stopped under a worker process: tests/scenarios/.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest
import trio
import trio.testing

from aggregates.lease import CLAIM_RETRY_MAX_S, claim_retry_s
from loop_actors import Runtime, StoreUnavailableError, Worker
from loop_actors.runtime.leases import LeaseKeeper
from tests.support.workers import AGENT

FAILURES = 8
POLL_S = 0.05


async def test_a_worker_backs_off_while_its_store_fails_logs_it_once_and_claims_after(
    db_url: str,
    clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts: list[float] = []
    claim = LeaseKeeper.claim

    async def failing_at_first(self: LeaseKeeper, *args: Any, **kwargs: Any) -> Any:
        attempts.append(trio.current_time())
        if len(attempts) <= FAILURES:
            raise StoreUnavailableError(
                "cannot reach the work queue's database: connection failed: Connection refused"
            )
        return await claim(self, *args, **kwargs)

    # Virtual time: it jumps whenever the loop waits on a thread for 50 ms of real time, so
    # on a loaded machine the store's threads alone can pass a minute of it.
    with trio.fail_after(900):
        await Runtime(db_url).submit(AGENT, "after the outage", invocation_id="later")
        monkeypatch.setattr(LeaseKeeper, "claim", failing_at_first)
        caplog.set_level(logging.WARNING)
        report = await Worker(AGENT, db_url, poll_s=POLL_S).run(until_idle=True)
    # It kept trying (until_idle did not take the outage for an empty queue), and claimed.
    assert report.outcomes == {"completed": 1}
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    for failures, gap in enumerate(gaps[:FAILURES], start=1):
        wait = claim_retry_s(failures, poll_s=POLL_S)
        assert 0.8 * wait <= gap <= 1.2 * wait + 0.5, (failures, gaps)
    assert max(gaps) <= 1.2 * CLAIM_RETRY_MAX_S + 0.5  # bounded: back within seconds
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2, warned  # not once per attempt
    assert warned[0].startswith(
        "the store cannot be used (claiming work: cannot reach the work queue's database: "
        "connection failed: Connection refused); "
    )
    assert warned[1].startswith("the store works again (it could not be used for ")
    assert all(r.exc_info is None for r in caplog.records if r.levelno >= logging.WARNING)
