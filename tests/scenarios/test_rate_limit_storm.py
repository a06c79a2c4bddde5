"""2,000 runs against a provider that refuses above N a second: none refused, none failed.

Issue 31's proof on a real PostgreSQL server: 1,000 invocations submitted to the store
and driven by three ``loop-actors worker`` processes, while 1,000 more run in this
process, all against the fake provider of ``tests/support/quota_provider.py`` serving
100 requests a second (its ledger, one SQLite file, counts every request and refuses
the 101st of a second with HTTP 429). Every process is given the limit a little under
the provider's (80 a second: the how-to's advice, for the few milliseconds a request is
sent after its start). The provider sees no request over its limit (no retry storm:
nothing was refused, so nothing was retried), and every run completes: none pauses or
fails ``rate_limited``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from loop_actors import Agent, EventStore, RateLimit, RetryPolicy, Runtime, Submission
from tests.support.cli import CLI, cli_env
from tests.support.quota_provider import MODEL, PROVIDER, LimitedModel, LimitedService

pytestmark = pytest.mark.slow

HERE = Path(__file__).parents[1] / "support"
PROVIDER_PER_SECOND = 100
PACED_PER_SECOND = 80
EACH = 1_000
"""Runs submitted for the workers, and runs of this process: 2,000 in all."""


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def _reasons(db: str, ids: list[str]) -> dict[str, int]:
    store = EventStore(db, read_only=True)
    try:
        counted: dict[str, int] = {}
        for invocation_id in ids:
            events = store.events(invocation_id)
            reason = str(getattr(events[-1], "reason", "running")) if events else "missing"
            counted[reason] = counted.get(reason, 0) + 1
        return counted
    finally:
        store.close()


def test_two_thousand_runs_over_three_workers_and_one_process_stay_under_the_limit(
    tmp_path: Path,
    postgres_url: str,
    workers: list[subprocess.Popen[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shutil.copy(HERE / "quota_provider.py", tmp_path / "quota_provider.py")
    service_db = tmp_path / "provider.db"
    service = LimitedService(service_db, limit=PROVIDER_PER_SECOND, window_s=1.0)
    env = {
        "QUOTA_SERVICE_DB": str(service_db),
        "QUOTA_LIMIT": str(PROVIDER_PER_SECOND),
        "QUOTA_WINDOW_S": "1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # One attempt only: a refused request would fail its run (model_error), never hide.
    agent = Agent("limited", LimitedModel(service, retry=RetryPolicy(max_attempts=1)), [])
    submitted = [f"q-{n:04}" for n in range(EACH)]
    here = [f"p-{n:04}" for n in range(EACH)]
    per_minute = PACED_PER_SECOND * 60

    async def submit() -> None:
        async with Runtime(postgres_url) as runtime:
            await runtime.submit_many(
                agent, [Submission(goal=i, invocation_id=i) for i in submitted]
            )

    trio.run(submit)
    for _ in range(3):
        workers.append(
            subprocess.Popen(
                [
                    *CLI,
                    "worker",
                    "--agent",
                    "quota_provider:agent",
                    "--rate-limit",
                    f"{PROVIDER}:{MODEL}:{per_minute}:-",
                    "--concurrency",
                    "16",
                    "--db",
                    postgres_url,
                ],
                cwd=tmp_path,
                env=cli_env(**env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    limit = RateLimit(provider=PROVIDER, model=MODEL, requests_per_minute=per_minute)

    async def run_here() -> None:
        with trio.fail_after(300):
            async with (
                Runtime(postgres_url, rate_limits=[limit]) as runtime,
                trio.open_nursery() as nursery,
            ):
                for invocation_id in here:
                    nursery.start_soon(
                        partial(runtime.run, agent, invocation_id, invocation_id=invocation_id)
                    )

    trio.run(run_here)
    deadline = time.monotonic() + 300
    while service.counts()[0] < 2 * EACH and time.monotonic() < deadline:
        assert all(process.poll() is None for process in workers), "a worker stopped"
        time.sleep(0.5)

    served, refused = service.counts()
    assert (served, refused) == (2 * EACH, 0)  # no request over the limit: no retries
    assert service.most_in_a_window() <= PROVIDER_PER_SECOND
    assert _reasons(postgres_url, submitted + here) == {"completed": 2 * EACH}
