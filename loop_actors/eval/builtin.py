"""The built-in evaluation set (``loop-actors eval --builtin``): one case per branch of seed 000.

The cases themselves (goal, task class, what each proves, expectations) are data: the
cases file ``builtin_cases/cases.json``. This module holds what runs them: one agent per
case (a scripted model and fake tools, among them a payment service that keeps its
records in a file of its own, outside the event store), and the drivers of the cases
that need more than a run: a cancel while a tool runs, and a real subprocess killed
with SIGKILL followed by a resume.

Each case guards one behaviour of the runtime. :class:`Fault` names, for each case, a
deliberate breakage of that behaviour (a limit set too lax, a write without
reconciliation, a verifier that accepts everything...). Running the set with a fault
(:func:`builtin_jobs`, or the CLI's ``--builtin-fault``) makes that case fail, which is
how the tests show that every case can fail.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import os
import re
import sqlite3
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Any

import trio

from aggregates.decisions import (
    Budget,
    ErrorClass,
    Final,
    ToolCall,
    ToolCalls,
    ToolEffect,
    ToolResult,
)
from aggregates.invocation import Turn
from loop_actors._errors import (
    InvocationNotFoundError,
    LoopActorsError,
    ToolError,
    UsageError,
)
from loop_actors._faults import CRASH_ENV
from loop_actors._messages import ModelRequest
from loop_actors.agent.agent import Agent
from loop_actors.agent.model import ScriptedModel
from loop_actors.agent.tools import Reconciled, Tool, ToolContext, tool
from loop_actors.eval.evaluate import Case, Job, Suite, drive_run
from loop_actors.runtime.runtime import Runtime
from loop_actors.store.url import StoreUrl

SUITE_NAME = "builtin"
AGENT_NAME = "builtin"
BARRIER_TIMEOUT_S = 2.0
"""How long the first read of the parallel case waits for the second to finish."""
COURIER_TIMEOUT_S = 60.0
"""The longest the cancellation case's tool waits (it is cancelled long before)."""


class BuiltinCaseError(LoopActorsError):
    """Raised when a built-in case cannot be driven (its crash subprocess did not die)."""


class Fault(StrEnum):
    """A deliberate breakage of the behaviour one built-in case guards.

    Only for checking the checks: with a fault, the case that guards it must fail.
    """

    NEEDLESS_TOOL_CALL = "needless_tool_call"
    """direct-answer: the agent calls a tool before it answers."""
    WRONG_TOOL = "wrong_tool"
    """one-tool-call: the agent calls ``search`` instead of ``lookup``."""
    READS_RUN_IN_SEQUENCE = "reads_run_in_sequence"
    """parallel-out-of-order: the two reads are declared writes, so they run one by one."""
    LENIENT_ARGUMENTS = "lenient_arguments"
    """malformed-and-unknown: the tool's schema accepts the malformed arguments."""
    WHOLE_BATCH_RETRIED = "whole_batch_retried"
    """partial-batch-failure: the agent retries the whole batch, not the failed call."""
    APPROVAL_RULE_REMOVED = "approval_rule_removed"
    """approval-required-write: the refund tool no longer requires approval."""
    REPEATED_PLAN_LIMIT_TOO_HIGH = "repeated_plan_limit_too_high"
    """repeated-plan: ``Budget.max_repeated_plan`` is 4, not 1."""
    CANCEL_IGNORED = "cancel_ignored"
    """cancel-while-tools-run: the cancel never reaches the run (the tool finishes)."""
    WRITE_WITHOUT_RECONCILIATION = "write_without_reconciliation"
    """crash-after-dispatch: the payment tool has no ``reconcile``."""
    WRITE_IGNORES_EFFECT_KEY = "write_ignores_effect_key"
    """resume-existing-effect-key: the payment tool sends a new key on every attempt."""
    VERIFIER_ACCEPTS_EVERYTHING = "verifier_accepts_everything"
    """validator-rejects-answer: the verifier passes every answer."""


GUARDS: dict[Fault, str] = {
    Fault.NEEDLESS_TOOL_CALL: "direct-answer",
    Fault.WRONG_TOOL: "one-tool-call",
    Fault.READS_RUN_IN_SEQUENCE: "parallel-out-of-order",
    Fault.LENIENT_ARGUMENTS: "malformed-and-unknown",
    Fault.WHOLE_BATCH_RETRIED: "partial-batch-failure",
    Fault.APPROVAL_RULE_REMOVED: "approval-required-write",
    Fault.REPEATED_PLAN_LIMIT_TOO_HIGH: "repeated-plan",
    Fault.CANCEL_IGNORED: "cancel-while-tools-run",
    Fault.WRITE_WITHOUT_RECONCILIATION: "crash-after-dispatch",
    Fault.WRITE_IGNORES_EFFECT_KEY: "resume-existing-effect-key",
    Fault.VERIFIER_ACCEPTS_EVERYTHING: "validator-rejects-answer",
}
"""Which case each fault breaks."""


def builtin_suite() -> Suite:
    """The built-in cases (``builtin_cases/cases.json``), checked like any cases file."""
    text = (
        importlib.resources.files("loop_actors.eval")
        .joinpath("builtin_cases", "cases.json")
        .read_text(encoding="utf-8")
    )
    return Suite.model_validate(json.loads(text))


def builtin_version(faults: Iterable[Fault] = ()) -> str:
    """The built-in agents' version: the installed package's, plus the faults if any.

    A new release, or a fault, gives the runs ids of their own.
    """
    try:
        version = importlib.metadata.version("loop-actors")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        version = "0+source"
    names = sorted(fault.value for fault in faults)
    return "+".join([version, *names])


# --------------------------------------------------------------------------- helpers


def _output(result: ToolResult) -> str:
    if result.error is not None:
        return f"error ({result.error.message})"
    return str(result.output)


def _last_results(request: ModelRequest) -> dict[str, ToolResult]:
    """The results of the latest turn that has any, by call id."""
    for turn in reversed(request.turns):
        if turn.results:
            return {result.call_id: result for result in turn.results}
    return {}


def _latest_by_tool(request: ModelRequest) -> dict[str, ToolResult]:
    """The latest result of each tool, by tool name."""
    latest: dict[str, ToolResult] = {}
    for result in request.results:
        latest[result.name] = result
    return latest


def _calls(step: int, *calls: tuple[str, dict[str, Any]]) -> ToolCalls:
    return ToolCalls(
        calls=[
            ToolCall(id=f"s{step}c{n}", name=name, arguments=arguments)
            for n, (name, arguments) in enumerate(calls, start=1)
        ]
    )


def _agent(
    decide: Callable[[ModelRequest], Any],
    tools: Sequence[Tool],
    faults: frozenset[Fault],
    **options: Any,
) -> Agent:
    return Agent(
        AGENT_NAME, ScriptedModel(decide), list(tools), version=builtin_version(faults), **options
    )


VALUES = {"k": "42", "profile": "active", "policy": "refund-under-100"}


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return VALUES.get(key, "unknown")


@tool(name="lookup")
def lenient_lookup(key: str | None = None, name: str | None = None) -> str:
    """Look a key up (a schema that accepts a misnamed argument: the fault)."""
    return VALUES.get(key or name or "", "unknown")


@tool
def search(query: str) -> str:
    """Search the documents (the wrong tool for a lookup)."""
    return "no results"


# --------------------------------------------------------------------------- the agents

Factory = Callable[[frozenset[Fault], "Services"], Agent]


@dataclass
class Services:
    """The fakes one case's agent talks to (shared by its tools and its driver)."""

    payments: PaymentService = field(default_factory=lambda: PaymentService(None))
    started: dict[str, trio.Event] = field(default_factory=dict)
    """Per invocation: set when the cancellation case's slow tool runs (or the run stopped)."""
    released: dict[str, trio.Event] = field(default_factory=dict)
    """Per invocation: set to let the slow tool finish (the ``cancel_ignored`` fault)."""
    finished: dict[str, trio.Event] = field(default_factory=dict)
    """Per invocation: set when the parallel case's second read finished."""
    failures: dict[str, int] = field(default_factory=dict)
    """Per invocation: calls of the partial-failure case's flaky read."""

    def event(self, table: dict[str, trio.Event], invocation_id: str) -> trio.Event:
        """The invocation's event of ``table`` (made on first use, inside trio)."""
        return table.setdefault(invocation_id, trio.Event())


def _direct_answer(faults: frozenset[Fault], services: Services) -> Agent:
    def decide(request: ModelRequest) -> Final | ToolCalls:
        if Fault.NEEDLESS_TOOL_CALL in faults and not request.results:
            return _calls(request.step, ("lookup", {"key": "k"}))
        return Final(answer="4")

    return _agent(decide, [lookup], faults)


def _one_tool_call(faults: frozenset[Fault], services: Services) -> Agent:
    def decide(request: ModelRequest) -> Final | ToolCalls:
        if not request.results:
            if Fault.WRONG_TOOL in faults:
                return ToolCalls(calls=[ToolCall(id="c1", name="search", arguments={"query": "k"})])
            return ToolCalls(calls=[ToolCall(id="c1", name="lookup", arguments={"key": "k"})])
        return Final(answer=f"k is {_output(_last_results(request)['c1'])}")

    return _agent(decide, [lookup, search], faults)


def _parallel(faults: frozenset[Fault], services: Services) -> Agent:
    effect = ToolEffect.WRITE if Fault.READS_RUN_IN_SEQUENCE in faults else ToolEffect.READ

    async def read_profile(context: ToolContext) -> str:
        """Read the customer's profile (it answers only once the policy was read)."""
        with trio.move_on_after(BARRIER_TIMEOUT_S):
            await services.event(services.finished, context.invocation_id).wait()
            return VALUES["profile"]
        raise ToolError("read_policy did not run alongside read_profile")

    async def read_policy(context: ToolContext) -> str:
        """Read the refund policy (it finishes first)."""
        await trio.lowlevel.checkpoint()
        services.event(services.finished, context.invocation_id).set()
        return VALUES["policy"]

    def decide(request: ModelRequest) -> Final | ToolCalls:
        if not request.results:
            return ToolCalls(
                calls=[
                    ToolCall(id="profile", name="read_profile"),
                    ToolCall(id="policy", name="read_policy"),
                ]
            )
        results = _last_results(request)
        return Final(
            answer=f"profile={_output(results['profile'])}; policy={_output(results['policy'])}"
        )

    tools = [tool(effect=effect)(read_profile), tool(effect=effect)(read_policy)]
    return _agent(decide, tools, faults)


def _malformed(faults: frozenset[Fault], services: Services) -> Agent:
    def decide(request: ModelRequest) -> Final | ToolCalls:
        match request.step:
            case 1:  # a misnamed argument: `key` is missing
                return ToolCalls(calls=[ToolCall(id="c1", name="lookup", arguments={"name": "k"})])
            case 2:  # a tool that does not exist
                return ToolCalls(
                    calls=[ToolCall(id="c2", name="lookup_value", arguments={"key": "k"})]
                )
            case 3:
                return ToolCalls(calls=[ToolCall(id="c3", name="lookup", arguments={"key": "k"})])
            case _:
                return Final(answer=f"k is {_output(_latest_by_tool(request)['lookup'])}")

    chosen = lenient_lookup if Fault.LENIENT_ARGUMENTS in faults else lookup
    return _agent(decide, [chosen], faults)


def _partial_failure(faults: frozenset[Fault], services: Services) -> Agent:
    def read_tier() -> str:
        """Read the customer's tier."""
        return "pro"

    def read_policy(context: ToolContext) -> str:
        """Read the refund policy (its service is down the first time)."""
        calls = services.failures.get(context.invocation_id, 0) + 1
        services.failures[context.invocation_id] = calls
        if calls == 1:
            raise ToolError(
                "the policy service is unavailable",
                error_class=ErrorClass.UNAVAILABLE,
                retryable=True,
            )
        return VALUES["policy"]

    def read_balance() -> int:
        """Read the customer's balance."""
        return 42

    names = ("read_tier", "read_policy", "read_balance")

    def decide(request: ModelRequest) -> Final | ToolCalls:
        latest = _latest_by_tool(request)
        failed = [name for name in names if name not in latest or latest[name].error is not None]
        if Fault.WHOLE_BATCH_RETRIED in faults and failed:
            failed = list(names)
        if failed:
            return _calls(request.step, *((name, {}) for name in failed))
        tier, policy, balance = (_output(latest[name]) for name in names)
        return Final(answer=f"tier={tier}; policy={policy}; balance={balance}")

    # The flaky read runs inline (on the trio thread): its per-run count needs no lock.
    tools = [tool(read_tier), tool(inline=True)(read_policy), tool(read_balance)]
    return _agent(decide, tools, faults)


def _approval(faults: frozenset[Fault], services: Services) -> Agent:
    def refund(order_id: str, amount: int) -> str:
        """Refund an amount of euros on an order; above 100 a person must approve it."""
        return f"refunded {amount} on {order_id}"

    rule: bool | Callable[[dict[str, Any]], bool] = (
        False if Fault.APPROVAL_RULE_REMOVED in faults else _over_100
    )

    def decide(request: ModelRequest) -> Final | ToolCalls:
        if not request.results:
            return ToolCalls(
                calls=[
                    ToolCall(id="r1", name="refund", arguments={"order_id": "A-1", "amount": 250})
                ]
            )
        return Final(answer=_output(_last_results(request)["r1"]))

    return _agent(decide, [tool(effect="write", requires_approval=rule)(refund)], faults)


def _over_100(arguments: dict[str, Any]) -> bool:
    """The approval rule of the built-in refund: above 100 euros."""
    return bool(arguments["amount"] > 100)


def _repeated_plan(faults: frozenset[Fault], services: Services) -> Agent:
    def check_status(order_id: str) -> str:
        """The shipping status of an order."""
        return f"{order_id}: label created, not shipped yet"

    def decide(request: ModelRequest) -> Final | ToolCalls:
        if request.step > 8:
            return Final(answer="A-7 has not shipped yet")
        return _calls(request.step, ("check_status", {"order_id": "A-7"}))

    limit = 4 if Fault.REPEATED_PLAN_LIMIT_TOO_HIGH in faults else 1
    return _agent(
        decide, [tool(check_status)], faults, budget=Budget(max_steps=10, max_repeated_plan=limit)
    )


def _cancellation(faults: frozenset[Fault], services: Services) -> Agent:
    async def wait_for_courier(context: ToolContext) -> str:
        """Wait until the courier answers."""
        services.event(services.started, context.invocation_id).set()
        with trio.move_on_after(COURIER_TIMEOUT_S):
            await services.event(services.released, context.invocation_id).wait()
            return "the courier picked the parcel up"
        return "the courier did not answer"

    def notify_customer(text: str) -> str:
        """Send the customer a message (a write)."""
        return f"sent: {text}"

    def decide(request: ModelRequest) -> Final | ToolCalls:
        match len([turn for turn in request.turns if turn.results]):
            case 0:
                return ToolCalls(calls=[ToolCall(id="w1", name="wait_for_courier")])
            case 1:
                return ToolCalls(
                    calls=[
                        ToolCall(
                            id="n1",
                            name="notify_customer",
                            arguments={"text": "your parcel is on its way"},
                        )
                    ]
                )
            case _:
                return Final(answer="the customer was told")

    tools = [tool(wait_for_courier), tool(effect="write")(notify_customer)]
    return _agent(decide, tools, faults, tool_timeout_s=COURIER_TIMEOUT_S * 2)


class PaymentService:
    """A fake payment provider: at most one charge per idempotency key, in its own SQLite file.

    It lives outside the event store (as a real service does), so a process killed
    mid-run leaves in it what it did. ``path`` None: a service that cannot be reached.
    """

    def __init__(self, path: Path | None) -> None:
        """A service keeping its charges in ``path``."""
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        if self.path is None:
            raise ToolError("the payment service is not set up", error_class=ErrorClass.UNAVAILABLE)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, timeout=10)
        db.execute(
            "CREATE TABLE IF NOT EXISTS charges (receipt INTEGER PRIMARY KEY, key TEXT UNIQUE,"
            " invocation_id TEXT, recipient TEXT, amount INTEGER)"
        )
        return db

    def charge(self, key: str, invocation_id: str, recipient: str, amount: int) -> dict[str, Any]:
        """Charge once per key: a key seen before answers the first charge's receipt."""
        with closing(self._connect()) as db:
            db.execute(
                "INSERT OR IGNORE INTO charges (key, invocation_id, recipient, amount)"
                " VALUES (?, ?, ?, ?)",
                (key, invocation_id, recipient, amount),
            )
        receipt = self.receipt(key)
        assert receipt is not None  # just written
        return receipt

    def receipt(self, key: str) -> dict[str, Any] | None:
        """The receipt of the charge made with ``key`` (and how often its payee was charged)."""
        with closing(self._connect()) as db:
            row = db.execute(
                "SELECT receipt, invocation_id, recipient, amount FROM charges WHERE key = ?",
                (key,),
            ).fetchone()
            if row is None:
                return None
            (charges,) = db.execute(
                "SELECT COUNT(*) FROM charges WHERE invocation_id = ? AND recipient = ?",
                (row[1], row[2]),
            ).fetchone()
        return {
            "receipt": f"R-{row[0]:04d}",
            "recipient": row[2],
            "amount": row[3],
            "charges": charges,
        }


def _payments(faults: frozenset[Fault], services: Services) -> Agent:
    service = services.payments
    ignores_key = Fault.WRITE_IGNORES_EFFECT_KEY in faults

    def pay(recipient: str, amount: int, context: ToolContext) -> dict[str, Any]:
        """Pay an amount of euros to a recipient (the effect key is the idempotency key)."""
        assert context.effect_key is not None  # always set for a write
        key = uuid.uuid4().hex if ignores_key else context.effect_key
        return service.charge(key, context.invocation_id, recipient, amount)

    def reconcile_payment(effect_key: str) -> Reconciled:
        """Ask the service what became of a payment, by its effect key."""
        receipt = service.receipt(effect_key)
        if receipt is None:
            return Reconciled(status="not_found")
        return Reconciled(status="committed", receipt=receipt)

    reconcile = None if Fault.WRITE_WITHOUT_RECONCILIATION in faults else reconcile_payment

    def decide(request: ModelRequest) -> Final | ToolCalls:
        if not request.results:
            found = re.search(r"Pay (\w+) (\d+)", request.goal)
            assert found is not None  # the built-in goals all name a payee and an amount
            arguments = {"recipient": found[1], "amount": int(found[2])}
            return ToolCalls(calls=[ToolCall(id="p1", name="pay", arguments=arguments)])
        result = _last_results(request)["p1"]
        if result.error is not None or not isinstance(result.output, dict):
            return Final(answer=f"not paid: {_output(result)}")
        output = result.output
        return Final(answer=f"{output['recipient']} charged {output['charges']} time(s)")

    return _agent(decide, [tool(effect="write", reconcile=reconcile)(pay)], faults)


def _validator(faults: frozenset[Fault], services: Services) -> Agent:
    def decide(request: ModelRequest) -> Final:
        if any(turn.verification for turn in request.turns):
            return Final(answer="order A-2 ships in 3 days")
        return Final(answer="soon, probably")

    def verify(answer: str, turns: list[Turn]) -> bool | str:
        if re.fullmatch(r"order A-2 ships in \d+ days", answer):
            return True
        return "the answer must read 'order A-2 ships in N days'"

    def accept(answer: str, turns: list[Turn]) -> bool:
        return True

    verifier = accept if Fault.VERIFIER_ACCEPTS_EVERYTHING in faults else verify
    return _agent(decide, [], faults, verifier=verifier)


# --------------------------------------------------------------------------- drivers


async def _drive_cancel(
    runtime: Runtime,
    agent: Agent,
    case: Case,
    invocation_id: str,
    *,
    services: Services,
    cancel: bool,
) -> None:
    """Run the case; once its slow tool runs, cancel the run (record the request)."""
    started = services.event(services.started, invocation_id)
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            try:
                await drive_run(runtime, agent, case, invocation_id)
            finally:
                started.set()  # a run that stopped without the tool wakes the driver too

        nursery.start_soon(run)
        await started.wait()
        if invocation_id not in runtime.running:
            return
        if cancel:
            await runtime.request_cancel(
                invocation_id, by="loop-actors eval", reason="the built-in cancellation case"
            )
        else:
            services.event(services.released, invocation_id).set()


def service_file(store_id: str | None) -> Path:
    """Where the built-in payment service of a store (by its identity) keeps its charges.

    A file of the temporary folder, named by the store's identity, so a new store
    (even at the same URL) never meets the charges of an older one.
    """
    return Path(tempfile.gettempdir()) / "loop-actors-eval" / f"payments-{store_id}.db"


def crash_store_problem(db_url: str) -> str | None:
    """Why the crash cases cannot run on this store (None: they can).

    Their subprocess must open the same store: an in-memory one is its own process's.
    """
    if StoreUrl.parse(db_url).kind == "memory":
        return (
            "the built-in crash cases kill a subprocess that must open the same store: "
            f"{db_url} is in memory; use a database file (--db sqlite:///eval.db)"
        )
    return None


async def _drive_crash(
    runtime: Runtime,
    agent: Agent,
    case: Case,
    invocation_id: str,
    *,
    point: str,
    faults: frozenset[Fault],
) -> None:
    """Run the case in a subprocess killed with SIGKILL at ``point``, then resume it here."""
    problem = crash_store_problem(runtime.db_url)
    if problem is not None:
        raise BuiltinCaseError(problem)
    service = service_file(runtime.store_id)
    real = _payments(faults, Services(payments=PaymentService(service)))
    try:
        await runtime.load(invocation_id)
    except InvocationNotFoundError:
        await _killed_child(
            db_url=runtime.db_url,
            case=case,
            invocation_id=invocation_id,
            service=service,
            faults=faults,
            point=point,
        )
        try:
            await runtime.load(invocation_id)
        except InvocationNotFoundError:
            raise BuiltinCaseError(
                f"the crash subprocess of {case.id} was killed before it recorded its run"
            ) from None
    await drive_run(runtime, real, case, invocation_id)


async def _killed_child(
    *,
    db_url: str,
    case: Case,
    invocation_id: str,
    service: Path,
    faults: frozenset[Fault],
    point: str,
) -> None:
    env = dict(os.environ)
    env[CRASH_ENV] = point
    command = [
        sys.executable,
        "-c",
        "from loop_actors.eval.builtin import crash_child; crash_child()",
        case.id,
        invocation_id,
        db_url,
        str(service),
        *sorted(faults),
    ]
    done = await trio.run_process(
        command, env=env, check=False, capture_stdout=True, capture_stderr=True
    )
    if done.returncode != -9:  # -SIGKILL
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise BuiltinCaseError(
            f"the crash subprocess of {case.id} exited {done.returncode} instead of being "
            f"killed at {point}: {' | '.join(tail) or 'no output'}"
        )


def crash_child() -> None:
    """The subprocess of a crash case: start the run; ``$LOOP_ACTORS_CRASH_AT`` kills it."""
    case_id, invocation_id, db_url, service, *fault_names = sys.argv[1:]
    faults = frozenset(Fault(name) for name in fault_names)
    case = next(case for case in builtin_suite().cases if case.id == case_id)
    agent = _payments(faults, Services(payments=PaymentService(Path(service))))
    Runtime(db_url).run_sync(
        agent, case.goal, invocation_id=invocation_id, task_class=case.task_class
    )
    sys.exit(f"the run of {case_id} was not killed")


_CRASH_POINTS = {
    "crash-after-dispatch": "after_dispatch_commit",
    "resume-existing-effect-key": "after_write_returned:1",
}

_FACTORIES: dict[str, Factory] = {
    "direct-answer": _direct_answer,
    "one-tool-call": _one_tool_call,
    "parallel-out-of-order": _parallel,
    "malformed-and-unknown": _malformed,
    "partial-batch-failure": _partial_failure,
    "approval-required-write": _approval,
    "repeated-plan": _repeated_plan,
    "cancel-while-tools-run": _cancellation,
    "crash-after-dispatch": _payments,
    "resume-existing-effect-key": _payments,
    "validator-rejects-answer": _validator,
}


def builtin_jobs(faults: Iterable[Fault] = (), only: Iterable[str] | None = None) -> list[Job]:
    """The built-in cases as jobs for ``run_jobs``, in their order; ``only`` picks cases by id.

    ``faults`` break the behaviours their cases guard (see :class:`Fault`): for checking
    that each case can fail. They are part of the agents' version, so the runs of a
    broken set never meet those of the healthy one.

    Raises:
        UsageError: ``only`` names a case that does not exist.
    """
    broken = frozenset(faults)
    cases = builtin_suite().cases
    wanted = None if only is None else set(only)
    if wanted is not None:
        unknown = sorted(wanted - {case.id for case in cases})
        if unknown:
            raise UsageError(f"no built-in case {', '.join(unknown)}")
    jobs = []
    for case in cases:
        if wanted is not None and case.id not in wanted:
            continue
        services = Services()
        agent = _FACTORIES[case.id](broken, services)
        drive = drive_run
        if case.id == "cancel-while-tools-run":
            cancel = Fault.CANCEL_IGNORED not in broken
            drive = partial(_drive_cancel, services=services, cancel=cancel)
        elif case.id in _CRASH_POINTS:
            drive = partial(_drive_crash, point=_CRASH_POINTS[case.id], faults=broken)
        jobs.append(Job(suite=SUITE_NAME, case=case, epoch=1, agent=agent, drive=drive))
    return jobs
