"""Report a drive once its closing fact is committed: the one hook the driver calls."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import trio

from aggregates.invocation import InvocationEvent, InvocationStarted, TraceParent
from loop_actors.telemetry.otel import content_on, emit_points, emit_spans, latest_experimental_on
from loop_actors.telemetry.spans import Report, drives_to_report, report, root_id_of

log = logging.getLogger(__name__)


class HistoryReader(Protocol):
    """What reads an invocation's committed events (the runtime's ``StoreReader``)."""

    async def events(self, invocation_id: str) -> list[InvocationEvent]:
        """Every committed event of an invocation."""
        ...


def root_trace_parent(
    started: InvocationStarted, root_history: Sequence[InvocationEvent] | None
) -> TraceParent | None:
    """The trace parent recorded by the invocation whose trace ``started``'s joins.

    That is ``started`` itself for a root (``root_history`` unused), else the first
    event of ``root_history``: the history of :func:`spans.root_id_of`.
    """
    if root_id_of(started) == started.originator_id:
        return started.trace_parent
    if not root_history:
        return None
    root = root_history[0]
    return root.trace_parent if isinstance(root, InvocationStarted) else None


def closing_report(
    history: Sequence[InvocationEvent], version_at_start: int, root: TraceParent | None
) -> Report:
    """What a process that began driving at ``version_at_start`` reports now."""
    drives = drives_to_report(history, version_at_start)
    if not drives:
        return Report((), ())
    return report(
        history,
        root_trace_parent=root,
        content=content_on(),
        drives=drives,
        latest_experimental=latest_experimental_on(),
    )


async def report_drive(reads: HistoryReader, invocation_id: str, version_at_start: int) -> None:
    """Read the history of a drive that just stopped, and emit what it closed.

    A failure here never touches the run: it is logged, and ``loop-actors trace
    export`` sends the same spans later.

    Cancellation: a checkpoint (the store read); nothing is emitted if cancelled.
    """
    try:
        history = await reads.events(invocation_id)
        started = history[0]
        assert isinstance(started, InvocationStarted)
        root_id = root_id_of(started)
        root_history = await reads.events(root_id) if root_id != invocation_id else None
        found = closing_report(history, version_at_start, root_trace_parent(started, root_history))
        if found.spans or found.points:
            await trio.to_thread.run_sync(_emit, found)
    except Exception:
        log.warning(
            "could not report the telemetry of invocation %s; "
            "'loop-actors trace export %s' sends it again",
            invocation_id,
            invocation_id,
            exc_info=True,
        )


def _emit(found: Report) -> None:
    emit_spans(found.spans)
    emit_points(found.points)
