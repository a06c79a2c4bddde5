"""A fake provider that allows N requests a window, shared by processes through a SQLite file.

:class:`LimitedService` is the provider's own ledger: each request is counted in its
window (``floor(time / window_s)``, this machine's clock); one above ``limit`` in a
window is refused as a real provider would, HTTP 429, and counted as over the limit.
:class:`LimitedModel` is a model adapter in front of it: its calls go through
``call_with_retries`` (with the quota of ``("fake", "m")``), as the OpenAI and Anthropic
adapters' do. The agent ``agent`` (``quota_provider:agent``) answers at once, for worker
processes; its service is ``$QUOTA_SERVICE_DB``.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import trio

from aggregates.decisions import Usage
from loop_actors import Agent, ModelReply, ModelRequest, RetryPolicy
from loop_actors.agent.adapters import call_with_retries

PROVIDER, MODEL = "fake", "m"


class TooManyRequests(Exception):
    """The provider's answer to a request over its limit (classified ``rate_limited``)."""

    status_code = 429

    def __init__(self, retry_after_s: float | None = None) -> None:
        super().__init__("429 Too Many Requests")
        headers = {} if retry_after_s is None else {"retry-after": str(retry_after_s)}
        self.response = type("Response", (), {"headers": headers})()


class LimitedService:
    """The provider's ledger of requests, by window, in a SQLite file any process opens."""

    def __init__(self, path: Path | str, *, limit: int, window_s: float) -> None:
        self.path = str(path)
        self.limit = limit
        self.window_s = window_s
        with sqlite3.connect(self.path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS seen (at REAL NOT NULL, refused INTEGER)")

    def send(self) -> bool:
        """One request now: True when served, False when refused (over the limit)."""
        now = time.time()
        window = math.floor(now / self.window_s) * self.window_s
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            (served,) = db.execute(
                "SELECT count(*) FROM seen WHERE refused = 0 AND at >= ? AND at < ?",
                (window, window + self.window_s),
            ).fetchone()
            refused = served >= self.limit
            db.execute("INSERT INTO seen VALUES (?, ?)", (now, int(refused)))
            db.execute("COMMIT")
        finally:
            db.close()
        return not refused

    def counts(self) -> tuple[int, int]:
        """Requests served, and refused as over the limit."""
        with sqlite3.connect(self.path) as db:
            served, refused = db.execute(
                "SELECT count(*) - coalesce(sum(refused), 0), coalesce(sum(refused), 0) FROM seen"
            ).fetchone()
        return int(served), int(refused)

    def most_in_a_window(self) -> int:
        """The most requests served in one window."""
        with sqlite3.connect(self.path) as db:
            times = [row[0] for row in db.execute("SELECT at FROM seen WHERE refused = 0")]
        windows: dict[int, int] = {}
        for at in times:
            key = math.floor(at / self.window_s)
            windows[key] = windows.get(key, 0) + 1
        return max(windows.values(), default=0)


class LimitedModel:
    """A model adapter in front of a :class:`LimitedService`: answers ``final`` at once."""

    provider = PROVIDER
    model = MODEL

    def __init__(self, service: LimitedService, *, retry: RetryPolicy | None = None) -> None:
        self.service = service
        self.retry = retry or RetryPolicy(max_attempts=2, base_s=0.01)

    async def _send(self) -> dict[str, Any]:
        if not await trio.to_thread.run_sync(self.service.send):
            raise TooManyRequests()
        return {"kind": "final", "answer": "served"}

    async def decide(self, request: ModelRequest) -> ModelReply:
        """One provider request (retried as the adapters retry), under the shared quota."""
        reply, attempts = await call_with_retries(
            self._send,
            self.retry,
            quota=(PROVIDER, MODEL),
            tokens=10,
            used_tokens=lambda _: 12,
        )
        return ModelReply(
            proposal=reply, usage=Usage(input_tokens=10, output_tokens=2, attempts=attempts)
        )


def _agent() -> Agent:
    path = os.environ.get("QUOTA_SERVICE_DB")
    limit = int(os.environ.get("QUOTA_LIMIT", "4"))
    window_s = float(os.environ.get("QUOTA_WINDOW_S", "2"))
    service = LimitedService(path or ":memory:", limit=limit, window_s=window_s)
    return Agent("limited", LimitedModel(service), [])


agent = _agent()
