"""The ``trace export`` command: the spans of an invocation and of those it led to."""

from __future__ import annotations

import argparse
from pathlib import Path

from aggregates.decisions import TerminalReason
from aggregates.handoffs import handoff_id_of
from aggregates.invocation import (
    BatchDispatched,
    BudgetReserved,
    InvocationEvent,
    InvocationStarted,
    Terminated,
)
from loop_actors._errors import InvocationNotFoundError, UsageError
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.reading import open_for_reading
from loop_actors.store.store import EventStore
from loop_actors.telemetry.export import export_to_otlp, otlp_json, shown_url
from loop_actors.telemetry.live import root_trace_parent
from loop_actors.telemetry.otel import latest_experimental_on
from loop_actors.telemetry.spans import SpanRecord, report, root_id_of


def _children(history: list[InvocationEvent]) -> list[str]:
    """The invocations that go on from this one: its children, and its handoff's target."""
    found: list[str] = []
    for event in history:
        if isinstance(event, BatchDispatched):
            found.extend(call.child_id for call in event.calls if call.child_id)
        elif isinstance(event, BudgetReserved):
            found.append(event.child_id)
        elif isinstance(event, Terminated) and event.reason is TerminalReason.HANDED_OFF:
            found.append(handoff_id_of(event.originator_id))
    return list(dict.fromkeys(found))


def tree_spans(
    store: EventStore, invocation_id: str, *, content: bool
) -> tuple[list[SpanRecord], int]:
    """The spans of an invocation and of every one below it; how many invocations."""
    history = store.events(invocation_id)
    started = history[0]
    assert isinstance(started, InvocationStarted)
    root_id = root_id_of(started)
    root_history = store.events(root_id) if root_id != invocation_id else None
    root = root_trace_parent(started, root_history)
    spans: list[SpanRecord] = []
    pending, seen = [invocation_id], set()
    while pending:
        current = pending.pop(0)
        if current in seen:
            continue
        seen.add(current)
        try:
            events = history if current == invocation_id else store.events(current)
        except InvocationNotFoundError:
            continue  # a child its parent has not started yet
        found = report(
            events,
            root_trace_parent=root,
            content=content,
            latest_experimental=latest_experimental_on(),
        )
        spans.extend(found.spans)
        pending.extend(_children(events))
    return spans, len(seen)


def run(args: argparse.Namespace) -> int:
    """``trace export ID --otlp URL | --out FILE``: send or write the spans; say where."""
    store = open_for_reading(args.db)
    try:
        spans, invocations = tree_spans(store, args.invocation_id, content=args.content)
    finally:
        store.close()
    if args.out is None:
        endpoint = export_to_otlp(spans, args.otlp)
        print(
            f"exported {len(spans)} spans of {invocations} invocation(s) to {shown_url(endpoint)}"
        )
        return ExitCode.OK
    document = otlp_json(spans)
    if args.out == "-":
        print(document)
        return ExitCode.OK
    try:
        Path(args.out).write_text(document + "\n", encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {args.out}: {error.strerror or error}") from None
    print(f"wrote {len(spans)} spans of {invocations} invocation(s) to {args.out} as OTLP/JSON")
    return ExitCode.OK
