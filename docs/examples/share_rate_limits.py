"""Share a provider's rate limit between many runs: they stay under it, none is refused.

Run it from this folder: ``python share_rate_limits.py``. A stand-in provider serves
3 requests a second and answers 429 to the next; 9 runs start at once. Without a shared
limit most of them are refused; with ``RateLimit(..., requests_per_minute=180)`` the
runtime hands their model calls out 3 a second, and every run completes. The limit's
state is in the store: workers on the same store (``loop-actors worker --rate-limit
demo:echo:180:-``) share it too.
"""

from __future__ import annotations

import math
import time
from typing import Any

import trio

from loop_actors import Agent, ModelReply, ModelRequest, RateLimit, RetryPolicy, Runtime
from loop_actors.agent.adapters import call_with_retries


class TooManyRequests(Exception):
    """What the provider answers over its limit (HTTP 429: classified ``rate_limited``)."""

    status_code = 429


class Provider:
    """A provider that serves 3 requests a second (by this machine's clock)."""

    def __init__(self) -> None:
        self.served: dict[int, int] = {}
        self.refused = 0

    def send(self) -> dict[str, Any]:
        second = math.floor(time.time())
        if self.served.get(second, 0) >= 3:
            self.refused += 1
            raise TooManyRequests("429 Too Many Requests")
        self.served[second] = self.served.get(second, 0) + 1
        return {"kind": "final", "answer": "served"}


class EchoModel:
    """A model adapter for the provider: its calls go through ``call_with_retries``."""

    provider, model = "demo", "echo"

    def __init__(self, service: Provider) -> None:
        self.service = service

    async def decide(self, request: ModelRequest) -> ModelReply:
        async def send() -> dict[str, Any]:
            return self.service.send()

        reply, _ = await call_with_retries(
            send, RetryPolicy(max_attempts=1), quota=(self.provider, self.model)
        )
        return ModelReply(proposal=reply)


limit = RateLimit(provider="demo", model="echo", requests_per_minute=180)


async def nine_runs(runtime: Runtime, agent: Agent) -> list[str]:
    reasons: list[str] = []

    async def one(n: int) -> None:
        reasons.append((await runtime.run(agent, f"question {n}")).reason.value)

    async with trio.open_nursery() as nursery:
        for n in range(9):
            nursery.start_soon(one, n)
    return sorted(set(reasons))


async def main() -> None:
    alone = Provider()
    async with Runtime("memory://") as runtime:
        reasons = await nine_runs(runtime, Agent("asker", EchoModel(alone), []))
    print(f"without a shared limit: {reasons}, some refused: {alone.refused > 0}")

    shared = Provider()
    async with Runtime("memory://", rate_limits=[limit]) as runtime:
        reasons = await nine_runs(runtime, Agent("asker", EchoModel(shared), []))
        assert runtime.quota is not None
        waited = runtime.quota.statistics().waited
    print(f"with RateLimit(requests_per_minute=180): {reasons}, {shared.refused} refused")
    print(f"most served in one second: {max(shared.served.values())}; calls that waited: {waited}")


if __name__ == "__main__":
    trio.run(main)
