"""What several command groups share: the runtime and agent they run, and how they print."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from aggregates.decisions import TerminalReason
from loop_actors._terminal import terminal_safe
from loop_actors.audit.checkpoint import load_signing_key
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.runtime.outage import is_outage
from loop_actors.runtime.outcome import Outcome
from loop_actors.runtime.runtime import Runtime
from loop_actors.store.store import EventStore
from loop_actors.store.url import resolve_db_url


def runtime_for(args: argparse.Namespace, *, existing: bool = False) -> Runtime:
    """The Runtime a command runs invocations with: ``--db`` and the checkpoint options.

    With ``existing``, the database must exist already (resume and reconcile create
    nothing). A checkpoint key file is read here, before anything runs.

    Raises:
        UsageError: a bad option, a missing database, or an unreadable key file.
    """
    url = resolve_db_url(getattr(args, "db", None))
    runtime = Runtime(
        url,
        checkpoint_dir=getattr(args, "checkpoint_dir", None),
        checkpoint_key=getattr(args, "checkpoint_key", None),
        checkpoint_every=getattr(args, "checkpoint_every", None),
    )
    if runtime.checkpoints is not None and runtime.checkpoints.key_file is not None:
        load_signing_key(runtime.checkpoints.key_file)
    if existing:
        EventStore(url, create=False).close()
    return runtime


def outcome_json(outcome: Outcome) -> str:
    """The outcome as one JSON object (``--json``)."""
    record: dict[str, Any] = {
        "invocation_id": outcome.invocation_id,
        "reason": outcome.reason.value,
        "answer": outcome.answer,
        "steps": outcome.steps,
        "tool_calls": outcome.tool_calls,
        "detail": outcome.detail,
    }
    if outcome.digest is not None:
        record["digest"] = outcome.digest
        record["pending_calls"] = outcome.pending_calls
    if outcome.path is not None:
        record["path"] = outcome.path
    if outcome.parent_id is not None:
        record["parent_id"] = outcome.parent_id
    if outcome.chain is not None:
        record["chain"] = outcome.chain
    if outcome.children is not None:
        record["children"] = outcome.children.model_dump(mode="json")
    if outcome.wake_at is not None:
        record["wake_at"] = outcome.wake_at.isoformat()
    if outcome.critic is not None:
        record["critic"] = outcome.critic.model_dump(mode="json")
    if outcome.plan is not None:
        record["plan"] = outcome.plan
    return json.dumps(record)


async def stored_events(runtime: Runtime, outcome: Outcome) -> int | None:
    """How many events the invocation of ``outcome`` has in the store; None if it cannot say.

    A run that stopped ``checkpoint_failed`` because its database went away (or filled
    up) is reported all the same: the count is what the store cannot give then (not
    even asked, when the runtime's tasks found the store gone: it would wait as long
    again for a connection).
    """
    if outcome.reason is TerminalReason.CHECKPOINT_FAILED and runtime.driver.leases.outages.down:
        return None
    try:
        return len(await runtime.history(outcome.invocation_id))
    except Exception as error:
        if not is_outage(error):
            raise
        return None


def outcome_lines(outcome: Outcome, events: int | None) -> list[str]:
    """The readable outcome; model and tool text escaped for the terminal.

    ``events``: the invocation's stored events (``events=?`` when the store could not say).
    """
    lines = [outcome.reason.value]
    if outcome.wake_at is not None:
        lines[0] += f" until {outcome.wake_at.isoformat()}"
    if outcome.answer is not None:
        lines.append(terminal_safe(outcome.answer))
    elif outcome.detail:
        lines.append(terminal_safe(outcome.detail))
    if outcome.plan is not None:  # what a person approves, and by which digest
        lines.extend(
            terminal_safe(f"  {w['step']}. {w['tool']} {json.dumps(w['arguments'])}")
            for w in outcome.plan
        )
        lines.append(f"digest={outcome.digest}")
    lines.append(
        f"steps={outcome.steps} tool_calls={outcome.tool_calls} "
        f"events={'?' if events is None else events} "
        f"id={terminal_safe(outcome.invocation_id)}"
    )
    return lines


def report(outcome: Outcome, event_count: int | None, *, as_json: bool) -> ExitCode:
    """Print an outcome (one JSON object, or the readable lines); return its exit code."""
    if as_json:
        print(outcome_json(outcome))
    else:
        print("\n".join(outcome_lines(outcome, event_count)))
    return ExitCode(outcome.exit_code)


def trio_run(fn: Callable[..., Awaitable[int]], *args: Any) -> int:
    """Run a command's trio loop; a Ctrl-C reaches its main task at a checkpoint only.

    So a real Ctrl-C never lands inside a tool's or a model's own code (which would
    make it that code's failure): it stops the command, exit 130.
    """
    return trio.run(fn, *args, restrict_keyboard_interrupt_to_checkpoints=True)
