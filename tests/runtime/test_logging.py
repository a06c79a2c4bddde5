"""What a runtime logs: lifecycle records with typed fields, loops' errors once, nothing private.

Bad inputs tried: a store whose events table disappears while a run waits for its model
(every read of the cancel watcher fails, about 1,200 times); a run whose arguments hold
a card number (a sensitive argument), a private memo (a plain argument), a write's
effect key, a sensitive output and a secret goal, all grepped for in every record at
DEBUG, formatted as text and as JSON with their tracebacks.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import loop_actors
from loop_actors import (
    Agent,
    EventStore,
    JsonLogFormatter,
    Runtime,
    ScriptedModel,
    TerminalReason,
    TextLogFormatter,
    ToolContext,
    tool,
)

CARD = "4111111111111111"
MEMO = "memo-private-5150"
RECEIPT_SECRET = "rcpt-secret-8842"
GOAL_SECRET = "goal-secret-3317"

effect_keys: list[str] = []


@tool
def lookup(query: str = "x") -> str:
    """Look something up."""
    return f"found {len(query)}"


@tool(
    effect="write",
    sensitive_arguments=["card"],
    sensitive_output=["receipt"],
    requires_approval=True,
)
def pay(card: str, amount: int, memo: str, context: ToolContext) -> dict[str, Any]:
    """Pay an amount with a card."""
    assert context.effect_key is not None
    effect_keys.append(context.effect_key)
    return {"receipt": RECEIPT_SECRET, "amount": amount}


def payer() -> Agent:
    """Step 1 looks up and pays (paused for approval); step 2 answers."""
    calls = [
        {"id": "l1", "name": "lookup", "arguments": {"query": MEMO}},
        {"id": "p1", "name": "pay", "arguments": {"card": CARD, "amount": 12, "memo": MEMO}},
    ]
    return Agent(
        "payer",
        ScriptedModel(
            [{"kind": "tool_calls", "calls": calls}, {"kind": "final", "answer": "paid"}]
        ),
        [lookup, pay],
    )


def ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("loop_actors")]


def with_id(records: list[logging.LogRecord], invocation_id: str) -> list[logging.LogRecord]:
    return [r for r in records if getattr(r, "invocation_id", None) == invocation_id]


async def test_a_run_logs_started_each_tool_call_and_ended_with_typed_fields(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="loop_actors")
    agent = Agent(
        "looker",
        ScriptedModel(
            [
                {"kind": "tool_calls", "calls": [{"id": "c1", "name": "lookup", "arguments": {}}]},
                {"kind": "final", "answer": "done"},
            ]
        ),
        [lookup],
    )
    with trio.fail_after(30):
        outcome = await Runtime(db_url).run(agent, "look", invocation_id="inv-1")
    assert outcome.reason is TerminalReason.COMPLETED
    records = with_id(ours(caplog), "inv-1")
    started = [r for r in records if r.getMessage().startswith("invocation inv-1 started")]
    (start,) = started
    assert (start.name, start.levelno, start.agent, start.step) == (  # type: ignore[attr-defined]
        "loop_actors.runtime",
        logging.INFO,
        "looker",
        0,
    )
    (call,) = [r for r in records if getattr(r, "tool", None) == "lookup"]
    assert (call.levelno, call.step, call.outcome) == (logging.DEBUG, 1, "ok")  # type: ignore[attr-defined]
    (end,) = [r for r in records if getattr(r, "reason", None) is not None]
    assert end.reason == "completed"  # type: ignore[attr-defined]
    assert type(end.reason) is str  # type: ignore[attr-defined]
    assert (end.outcome, end.step, end.levelno) == ("ended", 2, logging.INFO)  # type: ignore[attr-defined]


async def test_a_pause_and_its_resume_are_logged_with_the_reason(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="loop_actors")
    runtime = Runtime(db_url)
    with trio.fail_after(30):
        paused = await runtime.run(payer(), "pay", invocation_id="inv-p")
        assert paused.digest is not None
        await runtime.approve("inv-p", digest=paused.digest, by="alice")
        ended = await runtime.resume("inv-p", payer())
    assert (paused.reason, ended.reason) == (
        TerminalReason.APPROVAL_REQUIRED,
        TerminalReason.COMPLETED,
    )
    lines = [(r.getMessage().split(" (")[0], getattr(r, "reason", None)) for r in ours(caplog)]
    assert [line for line in lines if line[0].startswith("invocation inv-p")] == [
        ("invocation inv-p started", None),
        ("invocation inv-p paused: approval_required", "approval_required"),
        ("invocation inv-p resumed", None),
        ("invocation inv-p ended: completed", "completed"),
    ]


async def test_no_log_line_holds_an_argument_a_secret_an_output_or_an_effect_key(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every record of a run at DEBUG, as text and as JSON, tracebacks included."""
    caplog.set_level(logging.DEBUG)
    effect_keys.clear()
    runtime = Runtime(db_url)
    with trio.fail_after(30):
        paused = await runtime.run(payer(), f"pay for {GOAL_SECRET}", invocation_id="inv-s")
        assert paused.digest is not None
        await runtime.approve("inv-s", digest=paused.digest, by="alice")
        ended = await runtime.resume("inv-s", payer())
    assert ended.reason is TerminalReason.COMPLETED
    (key,) = effect_keys
    records = caplog.records
    assert len(records) > 5
    text, json_ = TextLogFormatter(), JsonLogFormatter()
    shown = "\n".join(f"{text.format(r)}\n{json_.format(r)}" for r in records)
    for private in (CARD, MEMO, RECEIPT_SECRET, GOAL_SECRET, key):
        assert private not in shown, private
    # The write was logged all the same, named by its effect key's hash.
    (paid,) = [r for r in records if getattr(r, "tool", None) == "pay"]
    assert getattr(paid, "effect_key_hash", "") in shown
    assert getattr(paid, "effect_status", None) == "committed"


def hide_events(db_url: str) -> None:
    """Rename the store's events table from another connection: every read of it fails."""
    with sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=5) as db:
        db.execute("ALTER TABLE stored_events RENAME TO stored_events_hidden")


def show_events(db_url: str) -> None:
    with sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=5) as db:
        db.execute("ALTER TABLE stored_events_hidden RENAME TO stored_events")


async def test_a_loop_whose_store_reads_fail_logs_it_once_not_at_every_poll(
    db_url: str,
    mock_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cancel watcher polls every 0.5 s: up to 1,100 failed reads in 550 s, one warning.

    Virtual time jumps while a read's thread is slow (a loaded machine): some polls are
    skipped, so the test asks for dozens (150 seen at load 8), not all 1,100.
    """
    mock_clock.autojump_threshold = 0.5  # threads open the store: no jump meanwhile
    polls: list[int] = []
    looked = EventStore.cancel_requests_after

    def counted(self: EventStore, position: int) -> tuple[list[str], int]:
        polls.append(position)
        return looked(self, position)

    monkeypatch.setattr(EventStore, "cancel_requests_after", counted)
    caplog.set_level(logging.DEBUG, logger="loop_actors")
    slow = Agent("slow", ScriptedModel([{"kind": "final", "answer": "late"}], delay_s=600), [])
    runtime = Runtime(db_url)
    with trio.fail_after(900):
        async with runtime, trio.open_nursery() as nursery:
            nursery.start_soon(partial(runtime.run, slow, "wait", invocation_id="inv-w"))
            await trio.sleep(5)
            assert runtime.running == ["inv-w"]
            hide_events(db_url)
            before = len(polls)
            mock_clock.autojump_threshold = 0.01  # 1,100 polls in seconds, not a minute
            await trio.sleep(550)
            mock_clock.autojump_threshold = 0.5
            failed_polls = len(polls) - before
            down = runtime.statistics()
            show_events(db_url)
            nursery.cancel_scope.cancel()  # the run ends ``cancelled``: no need to wait for it
    assert failed_polls >= 50
    assert down.store_down
    assert down.last_error is not None
    assert down.last_error.error_type == "OperationalError"
    about_cancels = [r for r in ours(caplog) if "cancel requests" in r.getMessage()]
    assert sorted((r.levelno, r.loop) for r in about_cancels) == [  # type: ignore[attr-defined]
        (logging.DEBUG, "store"),  # its traceback, once (the others are counted)
        (logging.WARNING, "store"),  # the outage: what happens meanwhile
    ]
    (traced,) = [r for r in about_cancels if r.levelno == logging.DEBUG]
    assert traced.exc_info is not None
    assert traced.error_type == "OperationalError"  # type: ignore[attr-defined]


def test_the_json_formatter_writes_one_object_a_line_with_the_fields() -> None:
    logger = logging.getLogger("loop_actors.runtime")
    record = logger.makeRecord(
        logger.name,
        logging.WARNING,
        __file__,
        1,
        "invocation %s ended: %s",
        ("inv-1", "completed"),
        None,
        extra={"invocation_id": "inv-1", "reason": TerminalReason.COMPLETED, "step": 2},
    )
    line = JsonLogFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["time"].endswith("+00:00")
    del parsed["time"]
    assert parsed == {
        "level": "warning",
        "logger": "loop_actors.runtime",
        "message": "invocation inv-1 ended: completed",
        "invocation_id": "inv-1",
        "step": 2,
        "reason": "completed",
    }


def test_the_library_adds_only_a_null_handler_and_configures_no_logging() -> None:
    """Silent unless the application configures logging: no basicConfig, no root handler."""
    Runtime("memory://")  # its modules are loaded
    handlers = logging.getLogger("loop_actors").handlers
    assert [type(h) for h in handlers] == [logging.NullHandler]
    package = Path(loop_actors.__file__).parent
    configuring = [
        path.relative_to(package)
        for path in package.rglob("*.py")
        if "basicConfig(" in path.read_text() or "getLogger().addHandler" in path.read_text()
    ]
    assert configuring == []


ABANDONING_WORKER = '''
"""A worker stopped with no grace while its run waits: it warns that it abandoned it."""

import logging
import sys

import trio

from loop_actors import Agent, Runtime, ScriptedModel, Worker

if sys.argv[1] == "configured":
    logging.basicConfig()
agent = Agent("slow", ScriptedModel([{"kind": "final", "answer": "late"}], delay_s=30), [])


async def main() -> None:
    db = sys.argv[2]
    await Runtime(db).submit(agent, "wait", invocation_id="w1")
    worker = Worker(agent, db, grace_s=0, poll_s=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        while not worker.running:
            await trio.sleep(0.05)
        worker.stop()
    print("stopped")


trio.run(main)
'''


@pytest.mark.parametrize("logging_", ["unconfigured", "configured"])
def test_with_no_logging_configured_a_run_prints_nothing_on_stderr(
    logging_: str, tmp_path: Path
) -> None:
    """What it warns about (a run abandoned) reaches stderr only once logging is configured."""
    script = tmp_path / "abandon.py"
    script.write_text(ABANDONING_WORKER)
    ran = subprocess.run(
        [sys.executable, str(script), logging_, f"sqlite:///{tmp_path / 'store.db'}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert (ran.returncode, ran.stdout) == (0, "stopped\n"), ran.stderr
    if logging_ == "unconfigured":
        assert ran.stderr == ""
    else:
        assert "did not reach a commit within 0 s: abandoned" in ran.stderr


async def test_a_record_made_under_a_current_span_carries_its_trace_and_span_ids(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With the OpenTelemetry API imported and a span current; without one, no ids."""
    trace = pytest.importorskip("opentelemetry.trace")
    context = trace.SpanContext(
        trace_id=0x5B8AA5A2D2C872E8321CF37308D69DF2,
        span_id=0x051581BF3CB55C13,
        is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    caplog.set_level(logging.INFO, logger="loop_actors")
    agent = Agent("traced", ScriptedModel([{"kind": "final", "answer": "ok"}]), [])
    runtime = Runtime(db_url)
    with trio.fail_after(30):
        with trace.use_span(trace.NonRecordingSpan(context)):
            await runtime.run(agent, "traced", invocation_id="inv-t")
        await runtime.run(agent, "plain", invocation_id="inv-u")
    (traced,) = [r for r in with_id(ours(caplog), "inv-t") if getattr(r, "reason", None)]
    assert traced.trace_id == "5b8aa5a2d2c872e8321cf37308d69df2"  # type: ignore[attr-defined]
    assert traced.span_id == "051581bf3cb55c13"  # type: ignore[attr-defined]
    (plain,) = [r for r in with_id(ours(caplog), "inv-u") if getattr(r, "reason", None)]
    assert not hasattr(plain, "trace_id")
