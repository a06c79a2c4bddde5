"""Shared rate limits across worker processes, on SQLite and PostgreSQL (real processes).

Three ``loop-actors worker --rate-limit fake:m:100:-`` processes drive invocations of
an agent whose model is the fake provider of ``tests/support/quota_provider.py``, which
serves 2 requests a second (120 a minute) and refuses the next with HTTP 429, across
processes (its ledger is one SQLite file). The workers share the limit through the
store: every invocation completes, and the provider refuses none. Then, on the same
store, many runs of one process do the same.

The limit is set a little under the provider's, as the how-to says: a request is sent
when its process wakes, a few milliseconds (tens, on a loaded machine) after its
scheduled start, so at exactly the provider's limit a late request and an on-time one
two places after it can fall into one of the provider's windows. 100 a minute paces
them 0.6 s apart: a third request in a window needs one 200 ms later than its start.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from loop_actors import (
    Agent,
    EventStore,
    RateLimit,
    RetryPolicy,
    Runtime,
    Submission,
    TerminalReason,
)
from tests.support.cli import CLI, cli_env
from tests.support.quota_provider import MODEL, PROVIDER, LimitedModel, LimitedService

pytestmark = pytest.mark.slow

HERE = Path(__file__).parents[1] / "support"
PER_SECOND = 2
LIMIT_PER_MINUTE = 100
"""The workers' limit: under the provider's 120 (``PER_SECOND * 60``)."""
COUNT = 12


class Folder:
    def __init__(self, path: Path, db: str) -> None:
        self.path = path
        shutil.copy(HERE / "quota_provider.py", path / "quota_provider.py")
        self.db = db
        self.service_db = path / "provider.db"
        self.service = LimitedService(self.service_db, limit=PER_SECOND, window_s=1.0)
        self.env = {
            "QUOTA_SERVICE_DB": str(self.service_db),
            "QUOTA_LIMIT": str(PER_SECOND),
            "QUOTA_WINDOW_S": "1",
        }
        self.workers: list[subprocess.Popen[str]] = []

    def start_worker(self) -> None:
        self.workers.append(
            subprocess.Popen(
                [
                    *CLI,
                    "worker",
                    "--agent",
                    "quota_provider:agent",
                    "--rate-limit",
                    f"{PROVIDER}:{MODEL}:{LIMIT_PER_MINUTE}:-",
                    "--db",
                    self.db,
                ],
                cwd=self.path,
                env=cli_env(**self.env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )

    def reasons(self, ids: list[str]) -> list[str | None]:
        store = EventStore(self.db, read_only=True)
        try:
            found = []
            for invocation_id in ids:
                events = store.events(invocation_id)
                last = events[-1] if events else None
                found.append(getattr(last, "reason", None) if last is not None else None)
            return [str(r) if r is not None else None for r in found]
        finally:
            store.close()


@pytest.fixture
def folder(tmp_path: Path, store_url: str) -> Iterator[Folder]:
    made = Folder(tmp_path, store_url)
    try:
        yield made
    finally:
        for process in made.workers:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=10)


def test_three_workers_and_many_runs_share_the_limit_and_stay_under_it(
    folder: Folder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUOTA_SERVICE_DB", str(folder.service_db))
    agent = Agent("limited", LimitedModel(folder.service, retry=RetryPolicy(max_attempts=1)), [])
    ids = [f"w-{n:02}" for n in range(COUNT)]

    async def submit() -> None:
        async with Runtime(folder.db) as runtime:
            await runtime.submit_many(agent, [Submission(goal=i, invocation_id=i) for i in ids])

    trio.run(submit)
    for _ in range(3):
        folder.start_worker()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and None in folder.reasons(ids):
        time.sleep(0.3)

    assert folder.reasons(ids) == [TerminalReason.COMPLETED.value] * COUNT
    assert folder.service.counts() == (COUNT, 0)
    assert folder.service.most_in_a_window() <= PER_SECOND

    limit = RateLimit(provider=PROVIDER, model=MODEL, requests_per_minute=LIMIT_PER_MINUTE)

    async def run_many() -> list[TerminalReason]:
        reasons: list[TerminalReason] = []
        async with Runtime(folder.db, rate_limits=[limit]) as runtime:

            async def one(n: int) -> None:
                reasons.append((await runtime.run(agent, f"again {n}")).reason)

            async with trio.open_nursery() as nursery:
                for n in range(COUNT):
                    nursery.start_soon(one, n)
        return reasons

    assert set(trio.run(run_many)) == {TerminalReason.COMPLETED}
    assert folder.service.counts() == (2 * COUNT, 0)
    assert folder.service.most_in_a_window() <= PER_SECOND
