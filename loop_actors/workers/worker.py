"""The Worker: claims runnable invocations from the queue and drives many at once."""

from __future__ import annotations

import logging
import math
import os
import random
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial

import trio

from aggregates.decisions import Frozen, TerminalReason
from aggregates.lease import DEFAULT_LEASE_S, HolderKind, QueueStatus, Release, claim_retry_s
from aggregates.rate_limits import RateLimit
from aggregates.schedules import due_time
from loop_actors._errors import (
    LoopActorsError,
    StoreUnavailableError,
    SubmissionError,
    SubmissionProblem,
    UsageError,
)
from loop_actors._faults import CrashPoint, fault_point
from loop_actors._guard import is_cancellation
from loop_actors._logs import BackgroundLoop, fields, package_logger
from loop_actors._statistics import ScheduleDue, ScheduleStatistics, WorkerStatistics
from loop_actors.agent.agent import Agent
from loop_actors.runtime.children import OfferedChildren
from loop_actors.runtime.gc_policy import GcPolicy
from loop_actors.runtime.handoffs import submit_target
from loop_actors.runtime.leases import (
    HeldLease,
    LeaseDrained,
    LeaseHolder,
    LeaseKeeper,
    new_holder_id,
)
from loop_actors.runtime.runtime import Runtime, _utc_now
from loop_actors.runtime.slots import DEFAULT_WORK_SLOTS
from loop_actors.runtime.submission import Submission, SubmittedStatus, submission_requests
from loop_actors.store.queue import Claimed
from loop_actors.store.reader import DriveReads
from loop_actors.store.schedule_rows import DueRuns, SchedulesChecked

log = package_logger(__name__)

DEFAULT_CONCURRENCY = 8
DEFAULT_GRACE_S = 30.0
DEFAULT_POLL_S = 0.1
"""How often an idle worker looks for runnable invocations (with jitter)."""
SCHEDULE_POLL_S = 1.0
"""How often a worker looks at the schedules at least (sooner when one is due sooner)."""

CHILD_OFFER_POLLS = 5
"""A child a worker's run submits is left to the workers for this many of its polls..."""

CHILD_OFFER_MIN_S = 2.0
"""... and at least this long (at most a lease period); then, if no worker claimed it
(every one is busy), the run that started it drives it itself."""


class WorkerReport(Frozen):
    """What a worker did, from its start to its stop."""

    worker_id: str
    claimed: int
    """Invocations it claimed (an invocation claimed twice counts twice)."""
    outcomes: dict[str, int]
    """How the runs it drove stopped, by reason."""
    drained: int
    """Runs it stopped at a commit because it was shutting down (another worker continues)."""
    abandoned: int
    """Runs it stopped mid-step (the grace period ran out, or a second signal came)."""
    failed: int
    """Claims it could not drive (left paused with a note, for a person)."""


class Worker:
    """Claims runnable invocations of the agents it serves, with a lease, and drives them.

    ``Worker(agents, db_url)`` does no I/O; ``await worker.run()`` registers it as a
    holder, then claims up to ``concurrency`` invocations at once (new ones, ones
    whose lease ran out, paused ones made runnable again), renews their leases
    every third of ``lease_s``, and drives each through the normal resume path,
    reconciliation included. :meth:`stop` shuts it down gracefully: it claims
    nothing more, each run stops at its next commit and gives its lease back, and
    whatever has not stopped within ``grace_s`` is abandoned (nothing is
    recorded for it; another worker continues from its last commit).
    """

    def __init__(
        self,
        agents: Agent | Sequence[Agent],
        db_url: str | None = None,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease_s: float = DEFAULT_LEASE_S,
        grace_s: float = DEFAULT_GRACE_S,
        poll_s: float = DEFAULT_POLL_S,
        now: Callable[[], datetime] = _utc_now,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_key: str | os.PathLike[str] | None = None,
        checkpoint_every: int | None = None,
        gc_policy: GcPolicy | None = None,
        work_slots: int | None = DEFAULT_WORK_SLOTS,
        rate_limits: Sequence[RateLimit] = (),
    ) -> None:
        """Prepare a worker for ``agents`` on the store at ``db_url``.

        The checkpoint options, ``gc_policy``, ``work_slots`` and ``rate_limits`` are the
        :class:`Runtime`'s (and default to the same environment variables): the worker's
        runtime writes checkpoints of the log outside the store.

        Raises:
            UsageError: no agent, two agents of one name, something that is not an
                Agent, a concurrency below 1, a lease shorter than 1 s, a negative
                grace period or a poll interval that is not positive.
            StoreUrlError: the URL is malformed.
        """
        served = [agents] if isinstance(agents, Agent) else list(agents)
        if not served:
            raise UsageError("a worker needs at least one agent to serve")
        for agent in served:
            if not isinstance(agent, Agent):
                raise UsageError(f"a worker serves Agents, got {type(agent).__name__}")
        names = [agent.name for agent in served]
        if len(set(names)) != len(names):
            raise UsageError(f"two agents of one name: {sorted(names)}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise UsageError(f"concurrency must be a whole number, at least 1, got {concurrency!r}")
        for name, value in (("grace_s", grace_s), ("poll_s", poll_s)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise UsageError(f"{name} must be a number of seconds, got {value!r}")
            if not math.isfinite(value) or value < 0 or (name == "poll_s" and value == 0):
                raise UsageError(f"{name} must be a finite number of seconds above 0, got {value}")
        self.agents = _with_reachable(served)
        """The agents it claims runs of, by name: those served, and every agent they start
        as children (``as_tool``) or hand off to, so that a tree spreads over workers."""
        names = list(self.agents)
        self.concurrency = concurrency
        self.grace_s = float(grace_s)
        self.poll_s = float(poll_s)
        self.runtime = Runtime(
            db_url,
            now=now,
            lease_s=lease_s,
            checkpoint_dir=checkpoint_dir,
            checkpoint_key=checkpoint_key,
            checkpoint_every=checkpoint_every,
            gc_policy=gc_policy,
            work_slots=work_slots,
            rate_limits=rate_limits,
        )
        runtime = self.runtime
        # A worker expires the leases of holders that died on its machine (reap).
        runtime.holder = LeaseHolder(
            kind=HolderKind.WORKER, agents=tuple(names), concurrency=concurrency, reap=True
        )
        runtime.holder_id = new_holder_id(HolderKind.WORKER)
        self.worker_id = runtime.holder_id
        """Its holder id (``worker:HOST:PID:RANDOM``), as ``loop-actors workers`` shows it."""
        self._active: dict[str, HeldLease] = {}
        self._stopping = False
        self._stop_requested = trio.Event()
        self._idle = trio.Event()
        self._wake = trio.Event()
        self._drives: trio.Nursery | None = None
        self._claimed = 0
        self._outcomes: Counter[str] = Counter()
        self._drained = 0
        self._abandoned = 0
        self._failed = 0
        self._claim_failures = 0
        self._drives_ended = 0
        """Drives that have ended so far (``until_idle`` looks at it around each claim)."""
        self._schedules = ScheduleStatistics()

    def statistics(self) -> WorkerStatistics:
        """What it drives now and has done since it started (and its runtime's statistics)."""
        return WorkerStatistics(
            worker_id=self.worker_id,
            running=len(self._active),
            concurrency=self.concurrency,
            stopping=self._stopping,
            claimed=self._claimed,
            outcomes={TerminalReason(reason): count for reason, count in self._outcomes.items()},
            drained=self._drained,
            abandoned=self._abandoned,
            failed=self._failed,
            claim_failures=self._claim_failures,
            schedules=self._schedules,
            runtime=self.runtime.statistics(),
        )

    @property
    def running(self) -> list[str]:
        """The ids of the invocations it drives now."""
        return list(self._active)

    def stop(self) -> None:
        """Shut down gracefully: claim nothing more, stop each run at its next commit.

        Runs still going after ``grace_s`` are abandoned (:meth:`stop_now`).
        """
        self._stopping = True
        for lease in self._active.values():
            lease.draining = True
        self._stop_requested.set()
        self._wake.set()

    def stop_now(self) -> None:
        """Stop at once: every run is abandoned where it is (nothing is recorded for it).

        Their leases are given back, so another worker continues each from its last
        commit (a batch dispatched without results is reconciled there).
        """
        self.stop()
        for lease in self._active.values():
            lease.abandoned = True
        if self._drives is not None:
            self._drives.cancel_scope.cancel()

    async def run(
        self,
        *,
        until_idle: bool = False,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> WorkerReport:
        """Claim and drive invocations until :meth:`stop` (or, ``until_idle``, none is left).

        Raises:
            StoreUnavailableError: the store cannot be opened.

        Cancellation: cancelling the caller abandons every run as :meth:`stop_now`
        does (nothing is recorded for them; their leases are given back within a
        bounded, shielded wait) and re-raises.
        """
        async with self.runtime:
            driver = self.runtime.driver
            # A tree spreads over the workers: children and handoff targets are runnable
            # rows (a child nobody claims within a lease period is driven by its parent's).
            driver.offer_children = OfferedChildren(frozenset(self.agents), self._offer_s())
            driver.after_handoff = partial(submit_target, driver)
            await driver.leases.register()
            log.info(
                "worker %s started (agents %s, concurrency %d)",
                self.worker_id,
                ", ".join(self.agents),
                self.concurrency,
                extra=fields(holder=self.worker_id),
            )
            task_status.started(self.worker_id)
            try:
                async with trio.open_nursery() as drives:
                    self._drives = drives
                    drives.start_soon(self._keep_grace)
                    drives.start_soon(self._run_schedules)
                    await self._claim_until_stopped(drives, until_idle=until_idle)
            except BaseException:
                for lease in self._active.values():
                    lease.abandoned = True
                raise
            finally:
                self._drives = None
                log.info(
                    "worker %s stopped (%d claimed, %d drained, %d abandoned, %d failed)",
                    self.worker_id,
                    self._claimed,
                    self._drained,
                    self._abandoned,
                    self._failed,
                    extra=fields(holder=self.worker_id),
                )
        return WorkerReport(
            worker_id=self.worker_id,
            claimed=self._claimed,
            outcomes=dict(self._outcomes),
            drained=self._drained,
            abandoned=self._abandoned,
            failed=self._failed,
        )

    async def _claim_until_stopped(self, drives: trio.Nursery, *, until_idle: bool) -> None:
        keeper = self.runtime.driver.leases
        names = list(self.agents)
        failures = 0
        while not self._stopping:
            free = self.concurrency - len(self._active)
            claims: list[tuple[HeldLease, Claimed]] = []
            # A drive that ends while the claim runs may have submitted work (a handoff's
            # target, a child) that the claim did not see: then this was not idleness.
            ended_before = self._drives_ended
            if free > 0:
                try:
                    claims = await keeper.claim(names, free)
                except StoreUnavailableError as error:
                    failures += 1
                    if not keeper.outages.failed("claiming work", error):
                        keeper.outages.throttle.caught(
                            log,
                            BackgroundLoop.CLAIMS,
                            error,
                            "cannot claim (%d failed polls); retrying",
                            failures,
                        )
                else:
                    failures = 0
                    keeper.outages.answered()
                self._claim_failures = failures
            fresh: list[tuple[HeldLease, Claimed]] = []
            for lease, claim in claims:
                self._claimed += 1
                if claim.invocation_id in self._active:
                    self._claimed_again(keeper, lease, claim)
                    continue
                self._active[claim.invocation_id] = lease
                fresh.append((lease, claim))
            # Read before the next claim: reads of batches at once, in threads of their
            # own, fought over the interpreter and took twice the CPU (measured).
            read = await self._read_before_driving([claim for _, claim in fresh])
            for lease, claim in fresh:
                drives.start_soon(self._drive, lease, claim, read.get(claim.invocation_id))
            if claims and len(self._active) < self.concurrency:
                await trio.lowlevel.checkpoint()
                continue  # more may be waiting
            idle = not claims and not self._active and self._drives_ended == ended_before
            if until_idle and idle and not failures:
                break  # idle: nothing left (a store that failed to answer may have some)
            self._wake = trio.Event()
            jitter = random.uniform(0.8, 1.2)  # noqa: S311 - spreads polls, nothing secret
            # While the store cannot be used, the claims back off (a stop still wakes it).
            wait_s = claim_retry_s(failures, poll_s=self.poll_s) if failures else self.poll_s
            with trio.move_on_after(wait_s * jitter):
                await self._wake.wait()
        self.stop()

    def _claimed_again(self, keeper: LeaseKeeper, lease: HeldLease, claim: Claimed) -> None:
        """This worker claimed an invocation it still drives: its lease ran out meanwhile.

        A renewal came too late (a busy event loop answers its heartbeat late), and the
        row was claimable again. Nobody else holds it: the run goes on under the new
        lease (no takeover to record). If the run is stopping already, the lease is
        given back, to be claimed again once that run has stopped.
        """
        running = self._active[claim.invocation_id]
        if running.lost or running.draining or running.abandoned:
            keeper.release_soon(lease, Release(status=QueueStatus.RUNNABLE, delay_s=self.poll_s))
            return
        running.epoch, running.valid_until = lease.epoch, lease.valid_until
        keeper.held[claim.invocation_id] = running

    def _offer_s(self) -> float:
        """How long a child it submits is left to the workers (``CHILD_OFFER_POLLS``)."""
        return min(self.runtime.lease_s, max(CHILD_OFFER_MIN_S, CHILD_OFFER_POLLS * self.poll_s))

    async def _keep_grace(self) -> None:
        """After a stop, wait ``grace_s`` for the runs to reach a commit, then abandon the rest."""
        await self._stop_requested.wait()
        with trio.move_on_after(self.grace_s):
            while self._active:
                self._idle = trio.Event()
                await self._idle.wait()
        if self._active:
            log.warning(
                "%d run(s) did not reach a commit within %g s: abandoned (another worker "
                "continues each from its last commit)",
                len(self._active),
                self.grace_s,
            )
            self.stop_now()

    async def _run_schedules(self) -> None:
        """Check the schedules of the agents served, and submit their due runs, until stopped.

        Each check is one short transaction of the queue (``WorkQueue.check_schedules``):
        the runs it decides are written as decided with the schedule moved on, then
        submitted under ids derived from the schedule and the due time (a second
        submission of one records nothing), then written as submitted. A worker that
        dies in between leaves them decided: a later check, of any worker, submits them.
        """
        keeper = self.runtime.driver.leases
        names = list(self.agents)
        while not self._stopping:
            wait_s = SCHEDULE_POLL_S
            try:
                checked = await keeper.call(keeper.queue.check_schedules, names)
            except StoreUnavailableError as error:
                self._schedules_failed(error, "checking the schedules")
            except Exception as error:  # a bug of ours: logged, and the worker serves on
                keeper.outages.throttle.caught(
                    log,
                    BackgroundLoop.SCHEDULES,
                    error,
                    "checking the schedules failed; trying again at the next poll",
                    level=logging.ERROR,
                )
            else:
                self._note_check(checked)
                for runs in checked.due:
                    await self._submit_due(runs)
                if checked.wait_s is not None:
                    wait_s = max(0.01, min(wait_s, checked.wait_s))
            with trio.move_on_after(wait_s):
                await self._stop_requested.wait()

    def _note_check(self, checked: SchedulesChecked) -> None:
        counts = self._schedules
        self._schedules = counts.model_copy(
            update={
                "checks": counts.checks + 1,
                "skipped": counts.skipped + sum(len(runs.skipped) for runs in checked.due),
                "next_due": [
                    ScheduleDue(name=name, due_at=due_time(due)) for name, due in checked.upcoming
                ],
            }
        )
        for runs in checked.due:
            for due in runs.skipped:
                log.info(
                    "schedule %s: the run due at %s is skipped (the previous one has not ended)",
                    runs.schedule.name,
                    due_time(due).isoformat(),
                )

    async def _submit_due(self, runs: DueRuns) -> None:
        """Submit the runs a check decided, one at a time; then note them as submitted.

        A run the store cannot take now stays decided (submitted again later); one whose
        id names an invocation of another goal or agent is given up, with a warning.
        """
        schedule = runs.schedule
        agent = self.agents[schedule.agent_name]
        if runs.dues:
            fault_point(CrashPoint.AFTER_SCHEDULE_DECIDED)
        done: list[int] = []
        for due in runs.dues:
            invocation_id = schedule.invocation_id(due)
            goal = Submission(schedule.goal, invocation_id=invocation_id)
            try:
                requests = submission_requests(agent, [goal], agent_ref=schedule.agent_ref)
                [went] = await self.runtime.driver.submit_many(requests, chunk_size=1)
            except SubmissionError as error:
                if error.problem is not SubmissionProblem.ID_TAKEN:
                    raise
                log.warning(
                    "schedule %s: %s is taken by another goal or agent; that run is not submitted",
                    schedule.name,
                    invocation_id,
                )
                done.append(due)
                continue
            except StoreUnavailableError as error:
                # It stays decided: the next check submits it again.
                self._schedules_failed(error, f"submitting {invocation_id} of {schedule.name}")
                break
            done.append(due)
            counts = self._schedules
            if went.status is SubmittedStatus.SUBMITTED:
                self._schedules = counts.model_copy(update={"submitted": counts.submitted + 1})
                log.info(
                    "schedule %s: submitted %s",
                    schedule.name,
                    invocation_id,
                    extra=fields(invocation_id=invocation_id),
                )
            else:
                update = {"already_submitted": counts.already_submitted + 1}
                self._schedules = counts.model_copy(update=update)
        if done:
            keeper = self.runtime.driver.leases
            try:
                await keeper.call(keeper.queue.schedule_submitted, schedule.name, done)
            except StoreUnavailableError as error:  # a later check finds them in the store
                self._schedules_failed(error, f"noting the runs of {schedule.name} as submitted")
            self._wake.set()  # claim them now

    def _schedules_failed(self, error: StoreUnavailableError, doing: str) -> None:
        """Note that the schedules' loop could not use the store while ``doing``.

        It is the outage the other loops report: one warning, no traceback, and "the
        store works again" when it does; the loop tries again at its next poll.
        """
        self.runtime.driver.leases.outages.failed(doing, error)

    async def _read_before_driving(
        self, claims: list[Claimed]
    ) -> dict[str, DriveReads | Exception]:
        """What the claimed runs read before they drive, for all of them at once.

        One trip to a reader thread for a batch instead of three per run (their
        invocation, the check of its history, its cancel request): a worker that
        claims thousands at once starts them several times sooner. A claim whose
        lease must be recorded first reads after recording it (``Driver.drive_claim``);
        if the store cannot be read now, each run reads for itself, as before.
        """
        ids = [claim.invocation_id for claim in claims if not claim.record]
        if not ids:
            return {}
        try:
            return await self.runtime.driver.reads.before_drive(ids)
        except Exception as error:
            self.runtime.driver.leases.outages.throttle.caught(
                log,
                BackgroundLoop.CLAIM_READS,
                error,
                "cannot read %d claimed runs at once; each reads its own",
                len(ids),
            )
            return {}

    async def _drive(
        self, lease: HeldLease, claim: Claimed, before: DriveReads | Exception | None = None
    ) -> None:
        if self._stopping:
            lease.draining = True
        try:
            outcome = await self.runtime.driver.drive_claim(
                lease, claim, self.agents[claim.agent_name], before
            )
            if outcome is None:
                self._failed += 1
            else:
                self._outcomes[outcome.reason.value] += 1
        except LeaseDrained:
            self._drained += 1
        except Exception as error:
            outages = self.runtime.driver.leases.outages
            if outages.failed(f"driving {claim.invocation_id}", error):
                # Nothing was recorded; its row is left runnable, for a later claim.
                self._outcomes[TerminalReason.CHECKPOINT_FAILED.value] += 1
            else:
                self._failed += 1
                # Our own typed errors (a cut history...) are for a person, not a bug: the
                # class only, as their messages may name an effect key; a bug's traceback.
                ours = isinstance(error, LoopActorsError)
                outages.throttle.caught(
                    log,
                    BackgroundLoop.DRIVES,
                    error,
                    "the run of %s stopped with %s; its row is left paused, its note says why",
                    claim.invocation_id,
                    type(error).__name__,
                    level=logging.WARNING if ours else logging.ERROR,
                    exc_info=not ours,
                    invocation_id=claim.invocation_id,
                )
        except BaseException as error:
            # Abandoned (``stop_now``, the grace period over, the caller cancelled): trio's
            # Cancelled, alone or in a group of the run's own nursery.
            if is_cancellation(error):
                self._abandoned += 1
            raise
        finally:
            if self._active.get(claim.invocation_id) is lease:
                del self._active[claim.invocation_id]
            self._drives_ended += 1
            self._wake.set()
            self._idle.set()


def _with_reachable(served: list[Agent]) -> dict[str, Agent]:
    """The agents served, by name, and those they can start (``Agent.reachable_agents``).

    An agent served explicitly is the one of its name.

    Raises:
        UsageError: two different agents of one name can be started, and neither is
            served explicitly.
    """
    agents = {agent.name: agent for agent in served}
    found: dict[str, Agent] = {}
    for agent in served:
        for reached in agent.reachable_agents():
            if reached.name in agents:
                continue
            other = found.setdefault(reached.name, reached)
            if other is not reached:
                raise UsageError(
                    f"two different agents named {reached.name!r} can be started by the agents "
                    "served (as children or handoff targets): serve the right one explicitly"
                )
    return agents | found
