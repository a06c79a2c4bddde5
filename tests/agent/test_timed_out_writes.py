"""A write whose call timed out is not sent again while its earlier attempt may still run.

Bad input: a plain-function write tool that takes longer than its timeout (its worker
thread is abandoned and goes on), with a service that answers "not found" until that
thread finishes. Real threads and real time: no mock clock.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import trio

from aggregates.effect import effect_key
from loop_actors import Agent, Reconciled, Runtime, ScriptedModel, TerminalReason, ToolContext, tool
from tests.support.replies import FINAL

WRITE = {"kind": "tool_calls", "calls": [{"id": "w1", "name": "slow_write", "arguments": {}}]}


class SlowService:
    """Commits a write only when the call's (slow) work is done; counts requests in flight."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.receipts: dict[str, dict[str, Any]] = {}
        self.requests = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.idle = threading.Event()
        self._lock = threading.Lock()

    def write(self, key: str) -> dict[str, Any]:
        with self._lock:
            self.requests += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep(self.work_s)
            with self._lock:
                self.receipts.setdefault(key, {"receipt": len(self.receipts) + 1})
                return self.receipts[key]
        finally:
            with self._lock:
                self.in_flight -= 1
                if not self.in_flight:
                    self.idle.set()

    def reconcile(self, key: str) -> Reconciled:
        with self._lock:
            if key in self.receipts:
                return Reconciled(status="committed", receipt=self.receipts[key])
        return Reconciled(status="not_found")


def slow_agent(service: SlowService, *, timeout_s: float) -> Agent:
    @tool(effect="write", reconcile=service.reconcile, timeout_s=timeout_s)
    def slow_write(context: ToolContext) -> dict[str, Any]:
        """A write that takes its time (a plain function: it runs in a worker thread)."""
        assert context.effect_key is not None
        return service.write(context.effect_key)

    return Agent("slow", ScriptedModel([WRITE, FINAL]), [slow_write])


async def test_a_timed_out_write_still_running_pauses_instead_of_being_sent_again(
    tmp_path: Path,
) -> None:
    service = SlowService(work_s=1.5)
    agent = slow_agent(service, timeout_s=0.2)
    url = f"sqlite:///{tmp_path / 'slow.db'}"
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            paused = await runtime.run(agent, "write slowly", invocation_id="slow-1")
            assert paused.reason is TerminalReason.RECONCILIATION_REQUIRED
            assert paused.detail is not None
            assert "may still be running" in paused.detail
            assert service.most_in_flight == 1
            # The abandoned attempt finishes; the service now knows the key.
            await trio.to_thread.run_sync(service.idle.wait)
            resumed = await runtime.resume("slow-1", agent)
    assert resumed.reason is TerminalReason.COMPLETED
    assert service.requests == 1
    assert service.most_in_flight == 1
    assert list(service.receipts) == [effect_key("slow-1", 1, "w1")]


async def test_a_timed_out_write_that_finishes_within_the_grace_is_settled_without_a_pause(
    tmp_path: Path,
) -> None:
    service = SlowService(work_s=0.35)
    agent = slow_agent(service, timeout_s=0.2)
    with trio.fail_after(30):
        async with Runtime(f"sqlite:///{tmp_path / 'slow.db'}") as runtime:
            outcome = await runtime.run(agent, "write slowly", invocation_id="slow-2")
            events = await runtime.history("slow-2")
    assert outcome.reason is TerminalReason.COMPLETED
    assert service.requests == 1
    assert service.most_in_flight == 1
    results = [r for e in events for r in getattr(e, "results", [])]
    assert results[0].output == {"receipt": 1}
