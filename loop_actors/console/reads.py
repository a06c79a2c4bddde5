"""What the console reads: the read models (caught up first) and the store, off the trio thread."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import trio

from aggregates.decisions import TerminalReason
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    ClarificationProvided,
    Invocation,
    InvocationEvent,
    Phase,
)
from loop_actors.audit.verify import ChainReport, verify_invocation
from loop_actors.runtime.runtime import Runtime
from loop_actors.store.history_records import history_records
from projections import (
    MetricsRow,
    ProjectionRunner,
    invocation_summary,
    list_invocations,
    list_open_effects,
    load_trajectory,
    metrics,
)
from projections.metrics import GroupBy
from projections.trajectory import InvocationStatus

T = TypeVar("T")

MAX_PAGE = 500
"""At most this many invocations a page (``limit``)."""
INBOX_LIMIT = 500
"""The approvals inbox looks at this many paused invocations at most."""


@dataclass(frozen=True)
class InvocationFilter:
    """The filters of the invocation list (``GET /api/invocations`` and the list page)."""

    agent: str | None = None
    status: InvocationStatus | None = None
    reason: TerminalReason | None = None
    roots_only: bool = False
    id_prefix: str | None = None
    started_from: str | None = None
    started_before: str | None = None
    limit: int = 50
    offset: int = 0


class ConsoleReads:
    """The console's reads over an open :class:`Runtime` that follows its read models."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def _read_models(self, read: Callable[[ProjectionRunner], T]) -> T:
        """Catch the read models up (another process may have committed), then read them."""
        runner = self.runtime.projections
        assert runner is not None, "the console's runtime follows its read models"

        def work() -> T:
            runner.catch_up()
            return read(runner)

        return await trio.to_thread.run_sync(work)

    async def invocations(self, where: InvocationFilter) -> list[dict[str, Any]]:
        """One page of invocations, newest first.

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await self._read_models(
            partial(
                list_invocations,
                agent=where.agent,
                status=where.status,
                reason=where.reason.value if where.reason is not None else None,
                roots_only=where.roots_only,
                id_prefix=where.id_prefix,
                started_from=where.started_from,
                started_before=where.started_before,
                limit=where.limit,
                offset=where.offset,
            )
        )

    async def metrics(self, by: GroupBy) -> list[MetricsRow]:
        """The metrics grouped by ``by`` (``loop-actors metrics --by``).

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await self._read_models(partial(metrics, by=by))

    async def summary(self) -> list[dict[str, Any]]:
        """How many invocations each agent has in each status.

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await self._read_models(invocation_summary)

    async def invocation(self, invocation_id: str) -> dict[str, Any] | None:
        """What the invocation page shows (:func:`invocation_view`); None if unknown to the views.

        Raises:
            InvocationNotFoundError: the read models know it, the store does not.

        Cancellation: a checkpoint; the reads' threads are abandoned (nothing changes).
        """
        events = await self.runtime.history(invocation_id)
        invocation = await self.runtime.load(invocation_id)
        driver = self.runtime.driver
        reports = await driver.reads.call(partial(verify_invocation, driver.store, invocation_id))
        view = await self._read_models(
            partial(
                invocation_view, invocation_id=invocation_id, events=events, invocation=invocation
            )
        )
        if view is not None:
            view["audit"] = audit_verdict(invocation_id, reports)
        return view

    async def waiting(self, invocation_id: str) -> dict[str, Any] | None:
        """The batch the invocation waits to have approved (:func:`waiting_of`).

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return waiting_of(await self.runtime.load(invocation_id))

    async def approvals(self) -> list[dict[str, Any]]:
        """Every invocation that waits for an approval, oldest pause first, with its batch.

        Cancellation: a checkpoint; the reads' threads are abandoned (nothing changes).
        """
        rows = await self._read_models(
            partial(
                list_invocations,
                status=InvocationStatus.PAUSED,
                reason=TerminalReason.APPROVAL_REQUIRED.value,
                limit=INBOX_LIMIT,
            )
        )
        inbox = []
        for row in rows:
            waiting = await self.waiting(row["invocation_id"])
            if waiting is not None:  # decided since the read models looked
                inbox.append({**row, **waiting})
        inbox.sort(key=lambda item: str(item["paused_at"]))
        return inbox

    async def open_effects(self) -> list[dict[str, Any]]:
        """The effects dispatched or of unknown outcome, oldest first (``loop-actors effects``).

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await self._read_models(list_open_effects)

    async def history(self, invocation_id: str, *, after: int = 0) -> list[dict[str, Any]]:
        """The ``history --json`` records after position ``after`` (``InvocationNotFoundError``).

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await read_history(self.runtime, invocation_id, after=after)


async def read_history(
    runtime: Runtime, invocation_id: str, *, after: int = 0
) -> list[dict[str, Any]]:
    """The ``history --json`` records after ``after``, read through the runtime's reader.

    Raises:
        InvocationNotFoundError: no such invocation.

    Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
    """
    driver = runtime.driver
    return await driver.reads.call(
        partial(history_records, driver.store, invocation_id, after=after)
    )


def invocation_view(
    runner: ProjectionRunner,
    *,
    invocation_id: str,
    events: Sequence[InvocationEvent],
    invocation: Invocation,
) -> dict[str, Any] | None:
    """An invocation's page (blocking): its trajectory, children and forks, decisions, waiting.

    None when the read models do not know it. ``events`` and ``invocation`` are its
    history and its state, read from the store.
    """
    trajectory = load_trajectory(runner, invocation_id)
    if trajectory is None:
        return None
    many = 2**62
    return {
        **trajectory.model_dump(mode="json"),
        "children": list_invocations(runner, parent_id=invocation_id, limit=many),
        "forks": list_invocations(runner, forked_from=invocation_id, limit=many),
        "decisions": [_decision(event) for event in events if _is_decision(event)],
        "waiting": waiting_of(invocation),
    }


def waiting_of(invocation: Invocation) -> dict[str, Any] | None:
    """The batch an invocation waits to have approved (digest, calls); None if it waits for none."""
    paused = invocation.paused
    if invocation.phase is not Phase.AWAITING_APPROVAL or paused is None:
        return None
    return {
        "kind": "approval",
        "step": paused.step,
        "digest": paused.proposal_digest,
        "calls": [call.model_dump(mode="json") for call in paused.calls or []],
        "needs_approval": paused.needs_approval or [],
        "paused_at": paused.timestamp.isoformat(),
    }


def audit_verdict(invocation_id: str, reports: Sequence[ChainReport]) -> dict[str, Any]:
    """What ``audit verify ID`` says of the invocation's chains, as the pages show it."""
    broken = [report for report in reports if not report.intact]
    return {
        "intact": not broken,
        "summary": (
            f"{len(reports)} chain{'' if len(reports) == 1 else 's'} intact "
            f"(audit verify {invocation_id})"
            if not broken
            else f"{len(broken)} of {len(reports)} chains broken: the store was changed"
        ),
        "reports": [report.model_dump(mode="json") for report in reports],
    }


_DECISIONS = (ApprovalGranted, ApprovalDenied, ClarificationProvided)


def _is_decision(event: object) -> bool:
    return isinstance(event, _DECISIONS)


def _decision(event: Any) -> dict[str, Any]:
    """A person's decision as the invocation page shows it: what, who, why, when."""
    match event:
        case ApprovalGranted():
            kind, why = "approved", event.note
        case ApprovalDenied():
            kind, why = "denied", event.reason
        case _:
            kind, why = "clarified", event.answer
    return {
        "kind": kind,
        "step": getattr(event, "step", None),
        "by": event.by,
        "why": why,
        "at": event.timestamp.isoformat(),
        "position": event.originator_version,
    }
