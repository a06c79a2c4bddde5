"""Bulk actions over a filter: cancel, resume, reconcile (``POST /api/bulk/{action}``).

Each is asked twice: a dry run says which of the invocations the filter matches it
would act on (and why it leaves the others), and the confirmation, typed as the dry
run gave it (``resume 3``), acts on those the filter matches then; when the count
changed meanwhile, nothing is done. The acts are the runtime's own, as the CLI's:
``request_cancel``, ``resume`` (``loop-actors resume``) and the reconcile sweep
(``loop-actors reconcile``), the last two only for the agents the console was given
(``serve --agent``). The rules of who may be resumed are the core's
(:func:`aggregates.standing.resume_skip`, :func:`~aggregates.standing.reconcile_skip`).

A resume or a sweep drives runs: they run in the console's own nursery
(:class:`ConsoleRuns`), not in the request, so a browser that goes away cancels none
of them; the answer waits for them a few seconds at most.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import trio
from starlette.responses import JSONResponse, Response

from aggregates.decisions import TerminalReason
from aggregates.invocation import Invocation
from aggregates.lease import lease_is_live
from aggregates.standing import BulkSkip, reconcile_skip, resume_skip, wake_at
from loop_actors._errors import InvocationExistsError, LeaseHeldError, UsageError
from loop_actors.agent.agent import Agent
from loop_actors.console.reads import ConsoleReads, InvocationFilter
from loop_actors.runtime.leases import LeaseDrained, is_gone
from loop_actors.runtime.outcome import Outcome
from loop_actors.runtime.reconcile_sweep import ReconcileReport
from loop_actors.runtime.runtime import Runtime
from projections.trajectory import InvocationStatus

logger = logging.getLogger(__name__)


MAX_BULK = 500
"""A bulk action looks at this many invocations at most (the newest the filter matches)."""
ANSWER_WAIT_S = 5.0
"""How long the answer to a resume or a reconcile waits for its runs (they go on after)."""
GRACE_S = 1.0
"""When the console stops, how long its runs get to reach a commit before they are abandoned."""
CONCURRENCY = 8
"""How many of its runs (resumes, sweeps) the console drives at once; the others wait."""


class BulkAction(StrEnum):
    """What a bulk action does to each invocation it acts on."""

    CANCEL = "cancel"
    """``request_cancel`` (as ``loop-actors cancel``)."""
    RESUME = "resume"
    """``resume`` (as ``loop-actors resume``): drives it on, in the console."""
    RECONCILE = "reconcile"
    """The reconcile sweep, restricted to them (as ``loop-actors reconcile``)."""


class StillRunning(StrEnum):
    """A run's result when the answer could not wait for it any longer."""

    RUNNING = "running"
    """Still being driven when the answer was sent: its page follows it."""


class RunRefusal(StrEnum):
    """Why a resume the console started did not drive the invocation."""

    LEASE_HELD = "lease_held"
    """Another holder took it since the dry run."""
    ALREADY_RUNNING = "already_running"
    """This console drives it already (an earlier bulk resume)."""
    FAILED = "failed"
    """The runtime refused it (a changed catalogue, a cut history...) or it failed: see
    ``details``."""


class NoAgentError(UsageError):
    """Raised for a bulk resume or reconcile when the console serves no agent (``409``)."""


@dataclass
class Pending:
    """One run the console started; ``done`` is set once it returned or failed."""

    done: trio.Event = field(default_factory=trio.Event)
    result: Any = None
    error: Exception | None = None

    @property
    def answered(self) -> bool:
        """It returned or raised (not: still running, or never started as the console stopped)."""
        return self.done.is_set() and (self.result is not None or self.error is not None)


class ConsoleRuns:
    """The agents the console serves, and the runs it drives for bulk resume and reconcile.

    :meth:`serve` holds the nursery they run in, for as long as the console serves.
    Without agents, bulk resume and reconcile are refused (``409 no_agent``).
    """

    def __init__(self, runtime: Runtime, agents: Sequence[Agent] = ()) -> None:
        """Runs of ``agents`` (their names must differ) through ``runtime``.

        Raises:
            UsageError: two agents of one name, or something that is not an Agent.
        """
        self.runtime = runtime
        self.agents: dict[str, Agent] = {}
        for agent in agents:
            if not isinstance(agent, Agent):
                raise UsageError(f"the console serves Agents, got {type(agent).__name__}")
            if agent.name in self.agents:
                raise UsageError(f"two agents are named {agent.name!r}: give each once")
            self.agents[agent.name] = agent
        self._nursery: trio.Nursery | None = None
        self._scopes: set[trio.CancelScope] = set()
        self._idle = trio.Event()
        self._limiter = trio.CapacityLimiter(CONCURRENCY)
        self._stopping = False

    async def serve(
        self,
        *,
        grace_s: float = GRACE_S,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Hold the runs' nursery until cancelled.

        Cancellation: each run is asked to stop at its next commit (as a worker that
        shuts down does); after ``grace_s`` the rest are abandoned where they are
        (nothing is recorded for them: a worker or a resume continues each from its
        last commit). None of them is recorded ``cancelled``.
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                with trio.CancelScope(shield=True):
                    await self._stop(grace_s)

    async def _stop(self, grace_s: float) -> None:
        self._stopping = True  # a run still waiting for its turn does not start
        held = self.runtime.driver.leases.held
        for lease in held.values():
            lease.draining = True
        with trio.move_on_after(grace_s):
            while self._scopes:
                self._idle = trio.Event()
                await self._idle.wait()
        for lease in held.values():
            lease.abandoned = True
        for scope in self._scopes:
            scope.cancel()

    def start(self, work: Callable[[], Awaitable[Any]]) -> Pending:
        """Run ``work`` in the console's nursery; what it returns or raises goes to the Pending.

        Raises:
            RuntimeError: :meth:`serve` is not running (a program that serves
                ``create_app`` itself starts it first).
        """
        if self._nursery is None:
            raise RuntimeError("the console's runs are not served: start ConsoleRuns.serve first")
        pending = Pending()
        self._nursery.start_soon(self._run, work, pending)
        return pending

    async def _run(self, work: Callable[[], Awaitable[Any]], pending: Pending) -> None:
        # Shielded: cancelling the console drains and abandons the run (_stop), it
        # never records it cancelled.
        with trio.CancelScope(shield=True) as scope:
            self._scopes.add(scope)
            try:
                async with self._limiter:
                    if not self._stopping:
                        pending.result = await work()
            except Exception as error:
                pending.error = error
                if not isinstance(error, InvocationExistsError | LeaseDrained):
                    logger.warning(
                        "a bulk action's run failed: %s: %s", type(error).__name__, error
                    )
            finally:
                self._scopes.discard(scope)
                pending.done.set()
                if not self._scopes:
                    self._idle.set()

    def check_can_drive(self, action: BulkAction) -> None:
        """Check that the console can resume or reconcile at all.

        Raises:
            NoAgentError: it serves no agent.
        """
        if not self.agents:
            raise NoAgentError(
                f"this console serves no agent, so it cannot {action.value} invocations: "
                "start it with serve --agent MODULE:ATTR (once per agent), or use "
                f"loop-actors {action.value} --agent MODULE:ATTR"
            )


@dataclass(frozen=True)
class Skipped:
    """A matched invocation that the action leaves alone, and why."""

    invocation_id: str
    why: BulkSkip
    detail: str

    def json(self) -> dict[str, str]:
        """As the dry run answers it."""
        return {"invocation_id": self.invocation_id, "why": self.why.value, "detail": self.detail}


@dataclass(frozen=True)
class Selection:
    """What a bulk action would act on now: the eligible ids, newest first, and the others."""

    eligible: list[str]
    skipped: list[Skipped]
    agents: dict[str, str] = field(default_factory=dict)
    """Each eligible invocation's agent name (for resume and reconcile)."""


async def select(
    action: BulkAction, reads: ConsoleReads, runs: ConsoleRuns, where: InvocationFilter
) -> Selection:
    """The invocations ``action`` would act on among those ``where`` matches (the newest 500).

    Cancellation: a checkpoint; the reads' threads are abandoned (nothing changes).
    """
    rows = await reads.invocations(where)
    match action:
        case BulkAction.CANCEL:
            live = [r["invocation_id"] for r in rows if r["status"] != InvocationStatus.TERMINATED]
            return Selection(live, [])
        case BulkAction.RESUME:
            return await _resumable(runs, rows)
        case BulkAction.RECONCILE:
            return await _reconcilable(runs, rows)


async def _resumable(runs: ConsoleRuns, rows: list[dict[str, Any]]) -> Selection:
    runtime = runs.runtime
    driver = runtime.driver
    eligible: list[str] = []
    skipped: list[Skipped] = []
    agents: dict[str, str] = {}
    for row in rows:
        if row["status"] == InvocationStatus.TERMINATED:
            continue
        invocation = await runtime.load(row["invocation_id"])
        skip = resume_skip(
            invocation,
            await driver.standing(invocation),
            agent_served=invocation.agent_name in runs.agents,
            lease_live=await _lease_live(runtime, invocation.id),
            at=driver.now(),
        )
        if skip is None:
            eligible.append(invocation.id)
            agents[invocation.id] = invocation.agent_name
        else:
            skipped.append(Skipped(invocation.id, skip, skip_detail(skip, invocation)))
    return Selection(eligible, skipped, agents)


async def _reconcilable(runs: ConsoleRuns, rows: list[dict[str, Any]]) -> Selection:
    reads = runs.runtime.driver.reads
    with_work = {effect.invocation_id for effect in await reads.open_effects()}
    with_work |= {i.id for i in await reads.paused_for_reconciliation()}
    eligible: list[str] = []
    skipped: list[Skipped] = []
    agents: dict[str, str] = {}
    for row in rows:  # newest first, as the list
        invocation_id = row["invocation_id"]
        if invocation_id not in with_work:
            continue
        invocation = await reads.invocation(invocation_id)
        skip = reconcile_skip(invocation, agent_served=invocation.agent_name in runs.agents)
        if skip is None:
            eligible.append(invocation_id)
            agents[invocation_id] = invocation.agent_name
        else:
            skipped.append(Skipped(invocation_id, skip, skip_detail(skip, invocation)))
    return Selection(eligible, skipped, agents)


async def _lease_live(runtime: Runtime, invocation_id: str) -> bool:
    """Whether a holder's lease on the invocation runs and its holder is not gone."""
    leases = runtime.driver.leases
    queue = leases.queue

    def read() -> bool:
        row = queue.row(invocation_id)
        now = queue.now()
        if row is None or row.holder is None or not lease_is_live(row, now):
            return False
        return not is_gone(queue.holder(row.holder), now)

    return await leases.call(read)


def skip_detail(skip: BulkSkip, invocation: Invocation) -> str:
    """What the operator can do about a skipped invocation, in words."""
    match skip:
        case BulkSkip.ENDED:
            return "it ended: nothing runs again"
        case BulkSkip.WAITS_FOR_APPROVAL:
            return "it waits for a person's approval: approve or deny it (Approvals)"
        case BulkSkip.WAITS_FOR_ANSWER:
            return "it waits for an answer to its question: answer it on its page"
        case BulkSkip.WAITS_FOR_CHILD:
            return "a child it started waits for a person's approval or answer (Approvals)"
        case BulkSkip.NOT_DUE:
            when = wake_at(invocation)
            return (
                f"it sleeps until {when.isoformat() if when else 'its wake time'}: a worker "
                f"wakes it then (or: loop-actors wake {invocation.id})"
            )
        case BulkSkip.LEASE_HELD:
            return "a live holder drives it now (a worker, a run, this console)"
        case BulkSkip.AGENT_NOT_SERVED:
            return (
                f"its agent {invocation.agent_name!r} is not one this console serves "
                "(serve --agent MODULE:ATTR)"
            )
        case BulkSkip.MAY_BE_RUNNING:
            return (
                "its open writes belong to a batch it may still be running: its run "
                f"settles them (or: loop-actors resume {invocation.id})"
            )


async def act(
    action: BulkAction,
    runtime: Runtime,
    runs: ConsoleRuns,
    selection: Selection,
    *,
    by: str | None,
    reason: str | None,
) -> tuple[dict[str, str], dict[str, str]]:
    """Do ``action`` to the selection's eligible invocations: each one's result, and details.

    Cancellation: a cancel is done in the request (a checkpoint between invocations);
    resumes and sweeps go on in the console's nursery.
    """
    results: dict[str, str] = {}
    details: dict[str, str] = {}
    match action:
        case BulkAction.CANCEL:
            for invocation_id in selection.eligible:
                cancelled = await runtime.request_cancel(invocation_id, by=by, reason=reason)
                results[invocation_id] = cancelled.value
        case BulkAction.RESUME:
            started = {
                invocation_id: runs.start(
                    _resume(runtime, invocation_id, runs.agents[selection.agents[invocation_id]])
                )
                for invocation_id in selection.eligible
            }
            await _wait(started.values())
            for invocation_id, pending in started.items():
                results[invocation_id], detail = _resumed(pending)
                if detail is not None:
                    details[invocation_id] = detail
        case BulkAction.RECONCILE:
            by_agent: dict[str, list[str]] = {}
            for invocation_id in selection.eligible:
                by_agent.setdefault(selection.agents[invocation_id], []).append(invocation_id)
            sweeps = {
                name: runs.start(_reconcile(runtime, runs.agents[name], ids))
                for name, ids in by_agent.items()
            }
            await _wait(sweeps.values())
            still_open = {e.invocation_id for e in await runtime.driver.reads.open_effects()}
            for name, pending in sweeps.items():
                _swept(by_agent[name], pending, still_open, results, details)
    return results, details


def _resume(runtime: Runtime, invocation_id: str, agent: Agent) -> Callable[[], Awaitable[Outcome]]:
    return lambda: runtime.resume(invocation_id, agent)


def _reconcile(
    runtime: Runtime, agent: Agent, invocation_ids: list[str]
) -> Callable[[], Awaitable[ReconcileReport]]:
    return lambda: runtime.reconcile(agent, invocation_ids=invocation_ids)


async def _wait(pending: Iterable[Pending]) -> None:
    with trio.move_on_after(ANSWER_WAIT_S):
        for one in pending:
            await one.done.wait()


def _resumed(pending: Pending) -> tuple[str, str | None]:
    """A resume's result as the answer gives it: its outcome's reason, or why not."""
    if not pending.answered:
        return StillRunning.RUNNING.value, None
    error = pending.error
    if error is None:
        outcome: Outcome = pending.result
        return outcome.reason.value, outcome.detail
    match error:
        case LeaseHeldError():
            return RunRefusal.LEASE_HELD.value, str(error)
        case InvocationExistsError():
            return RunRefusal.ALREADY_RUNNING.value, str(error)
        case _:
            return RunRefusal.FAILED.value, f"{type(error).__name__}: {error}"


class SweepResult(StrEnum):
    """What a reconcile sweep did for one invocation."""

    SETTLED = "settled"
    """Its open writes were settled (it had ended)."""
    NEEDS_PERSON = "needs_person"
    """A write of it only a person can settle (its tool has no ``reconcile``): see details."""
    STILL_OPEN = "still_open"
    """A write of it is still open (its service did not answer): a later sweep asks again."""
    LEFT_RUNNING = "left_running"
    """It was not paused for the sweep (it may be running): resume it."""


def _swept(
    invocation_ids: list[str],
    pending: Pending,
    still_open: set[str],
    results: dict[str, str],
    details: dict[str, str],
) -> None:
    """Each invocation's result of one agent's sweep."""
    if not pending.answered or pending.error is not None:
        for invocation_id in invocation_ids:
            if pending.error is None:
                results[invocation_id] = StillRunning.RUNNING.value
            else:
                results[invocation_id] = RunRefusal.FAILED.value
                details[invocation_id] = f"{type(pending.error).__name__}: {pending.error}"
        return
    report: ReconcileReport = pending.result
    resumed = {outcome.invocation_id: outcome for outcome in report.resumed}
    needs = {stuck.invocation_id: stuck for stuck in report.needs_person}
    for invocation_id in invocation_ids:
        if invocation_id in needs:  # resumed or not, it waits for a person now
            stuck = needs[invocation_id]
            results[invocation_id] = SweepResult.NEEDS_PERSON.value
            details[invocation_id] = (
                f"effect {stuck.effect_key} ({stuck.tool}): {stuck.why}; settle it by hand "
                "(Open effects)"
            )
        elif invocation_id in resumed:
            outcome = resumed[invocation_id]
            results[invocation_id] = outcome.reason.value
            if outcome.reason is TerminalReason.RECONCILIATION_REQUIRED and outcome.detail:
                details[invocation_id] = outcome.detail
        elif invocation_id in report.left_running:
            results[invocation_id] = SweepResult.LEFT_RUNNING.value
        elif invocation_id in still_open:
            results[invocation_id] = SweepResult.STILL_OPEN.value
        else:
            results[invocation_id] = SweepResult.SETTLED.value


def confirmation(action: BulkAction, count: int) -> str:
    """The text that confirms ``action`` of ``count`` invocations (``resume 3``)."""
    return f"{action.value} {count}"


@dataclass(frozen=True)
class BulkBody:
    """A bulk action's request body, checked (``loop_actors.console.api`` parses it)."""

    where: InvocationFilter
    dry_run: bool
    by: str | None
    reason: str | None
    confirm: str | None


async def bulk_answer(
    action: BulkAction, body: BulkBody, reads: ConsoleReads, runs: ConsoleRuns
) -> Response:
    """The answer to one bulk request: the dry run's selection, or what was done.

    Raises:
        NoAgentError: a resume or a reconcile, and the console serves no agent.

    Cancellation: a checkpoint; a dry run changes nothing, a cancel stops between
    invocations, resumes and sweeps already started go on.
    """
    if action is not BulkAction.CANCEL:
        runs.check_can_drive(action)
    selection = await select(action, reads, runs, body.where)
    confirm = confirmation(action, len(selection.eligible))
    if body.dry_run:
        return JSONResponse(
            {
                "dry_run": True,
                "matched": len(selection.eligible),
                "invocation_ids": selection.eligible,
                "skipped": [skipped.json() for skipped in selection.skipped],
                "confirm": confirm,
            }
        )
    if body.confirm != confirm:
        return JSONResponse(
            {
                "error": "confirmation_mismatch",
                "detail": f"the filter matches {len(selection.eligible)} invocations to "
                f"{action.value} now: confirm with {confirm!r} (after a new dry run); "
                "nothing was done",
            },
            status_code=409,
        )
    results, details = await act(
        action, reads.runtime, runs, selection, by=body.by, reason=body.reason
    )
    return JSONResponse(
        {
            "dry_run": False,
            "matched": len(selection.eligible),
            "results": results,
            "details": details,
        }
    )


__all__ = [
    "ANSWER_WAIT_S",
    "MAX_BULK",
    "BulkAction",
    "BulkBody",
    "ConsoleRuns",
    "NoAgentError",
    "RunRefusal",
    "StillRunning",
    "SweepResult",
    "bulk_answer",
    "skip_detail",
]
