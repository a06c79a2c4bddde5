"""A store that cannot be used is one warning per outage, and a runtime closes cleanly after one.

Bad inputs tried: failures of every task at once (renewals, cancel polls, releases) while
the store is gone, again and again; an error that is not an outage (a bug of ours); a
store that keeps failing and coming back; an error whose text holds a password; a disk
that fills up while a write tool runs (a real tmpfs, filled by another file).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio
from eventsourcing.persistence import OperationalError

from loop_actors import (
    Agent,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    StoreUnavailableError,
    TerminalReason,
    ToolContext,
    tool,
)
from loop_actors.runtime.outage import OUTAGE_LOG_EVERY_S, StoreOutages
from tests.support.disk import fill, free, mounted_tiny_disk
from tests.support.replies import calls, final

OUTAGE = "loop_actors.runtime"


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_outage_is_one_warning_however_many_tasks_fail_and_its_end_another(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outages = StoreOutages(lease_s=30, clock=clock)
    gone = OperationalError("no connection to PostgreSQL at db:5432/agents within 5 s")
    caplog.set_level(logging.DEBUG, logger=OUTAGE)
    for doing in ["renewing leases", "looking for cancel requests", "giving back leases"] * 20:
        assert outages.failed(doing, gone)
        clock.now += 0.5
    assert outages.down
    clock.now += 12
    outages.answered()
    outages.answered()  # nothing was down any more: nothing to say
    assert not outages.down
    warned = _warnings(caplog)
    assert [r.getMessage() for r in warned] == [
        "the store cannot be used (renewing leases: OperationalError: no connection to "
        "PostgreSQL at db:5432/agents within 5 s); runs stop at their next commit "
        "(checkpoint_failed: resume continues each from its last one), leases not given "
        "back run out within 30 s; trying again until it works",
        "the store works again (it could not be used for 42 s)",
    ]
    assert all(r.exc_info is None for r in warned)  # one line each, no traceback
    # Nothing is swallowed: the first failure's traceback is there, at DEBUG, and the
    # next one logged a minute later counts the others (not 60 tracebacks in 30 s).
    clock.now += 60
    assert outages.failed("renewing leases", gone)
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 2
    assert all(r.exc_info is not None and r.exc_info[1] is gone for r in debug)
    assert getattr(debug[1], "suppressed", None) == 59


def test_an_error_that_is_not_an_outage_is_left_to_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bad input: a bug of ours (a ValueError), which the caller logs with its traceback."""
    outages = StoreOutages(lease_s=30)
    caplog.set_level(logging.DEBUG, logger=OUTAGE)
    assert not outages.failed("renewing leases", ValueError("a bug"))
    assert not outages.down
    assert caplog.records == []


def test_a_store_that_keeps_coming_back_is_warned_about_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outages = StoreOutages(lease_s=30, clock=clock)
    full = StoreUnavailableError("the work queue cannot be used: database or disk is full")
    for _ in range(5):  # a nearly full disk, for 50 s: one write in two fails
        outages.failed("renewing leases", full)
        clock.now += 5
        outages.answered()
        clock.now += 5
    clock.now += OUTAGE_LOG_EVERY_S
    outages.failed("renewing leases", full)
    warned = [r.getMessage() for r in _warnings(caplog)]
    assert len(warned) == 3  # the first outage, its end, and the one a minute later
    assert warned[0].startswith(
        "the store cannot be used (renewing leases: the work queue cannot be used: "
        "database or disk is full); "
    )
    assert warned[1] == "the store works again (it could not be used for 5 s)"
    assert warned[2] == warned[0]


def test_an_outage_warning_shows_no_password_and_stays_on_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bad input: a driver's message of two lines naming a URL with its password."""
    outages = StoreOutages(lease_s=30)
    error = StoreUnavailableError(
        "cannot reach postgresql://app:Secret-9@db/agents:\n\tIs the server running?"
    )
    outages.failed("claiming work", error)
    (warned,) = _warnings(caplog)
    assert "Secret-9" not in warned.getMessage()
    assert "postgresql://app:***@db/agents: Is the server running?" in warned.getMessage()
    assert "\n" not in warned.getMessage()


class Service:
    """A payment service outside the full disk: payments by idempotency key."""

    def __init__(self) -> None:
        self.payments: dict[str, str] = {}
        self.attempts = 0

    def pay(self, key: str) -> dict[str, str]:
        self.attempts += 1
        receipt = self.payments.setdefault(key, f"r-{len(self.payments) + 1}")
        return {"receipt": receipt}

    def reconcile(self, effect_key: str) -> Reconciled:
        if effect_key not in self.payments:
            return Reconciled(status="not_found")
        return Reconciled(status="committed", receipt={"receipt": self.payments[effect_key]})


async def test_a_disk_that_fills_up_mid_run_ends_it_checkpoint_failed_and_the_runtime_closes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk fills while a write runs: its results cannot be committed, nor its lease given back.

    The run returns ``checkpoint_failed``; leaving ``async with Runtime`` raises nothing
    (the lease that could not be given back runs out by itself); one warning, no
    traceback. Once there is room again, resume finishes it and the payment is made once.
    """
    service = Service()
    with mounted_tiny_disk(tmp_path) as disk:

        @tool(effect="write", reconcile=service.reconcile)
        def pay(amount: int, context: ToolContext) -> dict[str, str]:
            """Pay, while another file takes the rest of the store's disk."""
            assert context.effect_key is not None
            receipt = service.pay(context.effect_key)
            assert fill(disk) > 0
            return receipt

        def decide(request: ModelRequest) -> dict[str, Any]:
            if request.step == 1:
                return calls(("p1", "pay", {"amount": 30}))
            return final(f"paid {request.turns[-1].results[0].output}")

        agent = Agent("payer", ScriptedModel(decide), [pay])
        url = f"sqlite:///{disk / 'store.db'}"
        caplog.set_level(logging.WARNING)
        with trio.fail_after(60):
            async with Runtime(url) as runtime:
                outcome = await runtime.run(agent, "pay 30", invocation_id="full")
            assert outcome.reason is TerminalReason.CHECKPOINT_FAILED
            assert outcome.detail is not None
            assert "database or disk is full" in outcome.detail
            warned = _warnings(caplog)
            assert len(warned) == 1, [r.getMessage() for r in warned]
            assert warned[0].getMessage().startswith("the store cannot be used (")
            assert "database or disk is full" in warned[0].getMessage()
            assert warned[0].exc_info is None
            free(disk)
            async with Runtime(url) as runtime:
                kept = [type(e).__name__ for e in await runtime.history("full")]
                # The closed runtime's lease, if its row was written before the disk
                # filled, could not be given back: it runs out in 30 s, or is taken over.
                resumed = await runtime.resume("full", agent, take_over=True)
    assert kept == ["InvocationStarted", "DecisionProposed", "BatchDispatched"]
    assert resumed.reason is TerminalReason.COMPLETED
    assert resumed.answer == "paid {'receipt': 'r-1'}"
    assert service.attempts == 1  # the resume took the service's receipt: paid once
