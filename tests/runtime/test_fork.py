"""Fork: a new invocation copied from a past step of another, then live, knowing the source's writes.

Every test records a paying run for real first (the payment service records each
charge with the effect key it was given), then forks it through ``Runtime.fork`` or
``loop-actors fork``: the fork must not repeat the source's payment unless told to,
the source must stay untouched, and both chains must verify.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.fork import ForkRefusal
from loop_actors import (
    Agent,
    Budget,
    ErrorClass,
    ForkRefusedError,
    LeaseHeldError,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolContext,
    ToolError,
    UsageError,
    tool,
)
from loop_actors.agent.tools import Tool
from loop_actors.cli import main

SOURCE_SCRIPT: list[dict[str, Any]] = [
    {"kind": "tool_calls", "calls": [{"id": "c1", "name": "lookup", "arguments": {"q": "a-1"}}]},
    {"kind": "tool_calls", "calls": [{"id": "c2", "name": "pay", "arguments": {"amount": 40}}]},
    {"kind": "final", "answer": "paid 40"},
]
CHANGED_SCRIPT: list[dict[str, Any]] = [
    {"kind": "final", "answer": "step 1 is copied: never asked"},
    {"kind": "tool_calls", "calls": [{"id": "x", "name": "pay", "arguments": {"amount": 40}}]},
    {"kind": "final", "answer": "paid 40 in the fork"},
]


class PaymentService:
    """Records every charge with the effect key (idempotency key) it was sent."""

    def __init__(self) -> None:
        self.charges: list[tuple[int, str | None]] = []
        self.fail_with_unknown = False

    def tools(self) -> list[Tool]:
        def lookup(q: str) -> str:
            """Look an order up."""
            return q.upper()

        def pay(amount: int, ctx: ToolContext) -> dict[str, str]:
            """Charge the customer."""
            if self.fail_with_unknown:
                raise ToolError("the payment service timed out", error_class=ErrorClass.TIMEOUT)
            self.charges.append((amount, ctx.effect_key))
            return {"receipt": f"r-{len(self.charges)}"}

        return [tool(lookup), tool(effect="write")(pay)]


def payer(service: PaymentService, script: list[dict[str, Any]] = SOURCE_SCRIPT) -> Agent:
    return Agent("payer", ScriptedModel(script), service.tools(), Budget(max_steps=10))


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


async def paid_source(url: str, service: PaymentService) -> str:
    async with Runtime(url) as runtime:
        outcome = await runtime.run(payer(service), "refund A-1", invocation_id="source")
    assert outcome.reason is TerminalReason.COMPLETED
    assert len(service.charges) == 1
    return outcome.invocation_id


async def fork_paid_run(url: str, service: PaymentService, writes: str) -> tuple[Any, Any]:
    """Record the paying run, fork it at step 1 under the changed agent; the fork, as loaded."""
    source = await paid_source(url, service)
    async with Runtime(url) as runtime:
        forked = await runtime.fork(
            source,
            at_step=1,
            agent=payer(service, CHANGED_SCRIPT),
            writes=writes,
            by="ops",
            reason="try",
        )
        return forked, await runtime.load(forked.fork_id)


async def test_by_default_a_fork_that_repeats_the_sources_payment_waits_for_a_person(
    url: str,
) -> None:
    service = PaymentService()
    with trio.fail_after(30):
        source = await paid_source(url, service)
        async with Runtime(url) as runtime:
            before = await runtime.history(source)
            forked = await runtime.fork(
                source,
                at_step=1,
                agent=payer(service, CHANGED_SCRIPT),
                by="ops",
                reason="try the changed loop",
            )
            after = await runtime.history(source)
            fork_events = await runtime.history(forked.fork_id)
    outcome = forked.outcome
    assert outcome is not None
    assert outcome.reason is TerminalReason.APPROVAL_REQUIRED
    assert len(service.charges) == 1  # no second charge
    source_key = service.charges[0][1]
    assert outcome.detail is not None
    assert source_key is not None
    assert source_key in outcome.detail
    assert "step 2" in outcome.detail
    assert [e.chain_hash for e in after] == [e.chain_hash for e in before]  # untouched
    start = fork_events[0]
    origin = start.forked_from  # type: ignore[attr-defined]
    assert (origin.source_id, origin.at_step, origin.by) == (source, 1, "ops")
    assert origin.source_head_hash == before[-1].chain_hash
    assert [w.effect_key for w in origin.source_writes] == [source_key]


async def test_an_approved_repeat_is_a_new_write_under_the_forks_own_key(url: str) -> None:
    service = PaymentService()
    with trio.fail_after(30):
        source = await paid_source(url, service)
        async with Runtime(url) as runtime:
            forked = await runtime.fork(
                source, at_step=1, agent=payer(service, CHANGED_SCRIPT), by="ops", reason="try"
            )
            assert forked.outcome is not None
            assert forked.outcome.digest is not None
            await runtime.approve(forked.fork_id, digest=forked.outcome.digest, by="alice")
            outcome = await runtime.resume(forked.fork_id, payer(service, CHANGED_SCRIPT))
    assert outcome.reason is TerminalReason.COMPLETED
    assert len(service.charges) == 2
    assert service.charges[0][1] != service.charges[1][1]


async def test_dedupe_completes_with_the_sources_receipt_and_no_second_charge(url: str) -> None:
    service = PaymentService()
    with trio.fail_after(30):
        forked, fork = await fork_paid_run(url, service, "dedupe")
    assert forked.outcome.reason is TerminalReason.COMPLETED
    assert forked.outcome.answer == "paid 40 in the fork"
    assert len(service.charges) == 1
    reused = fork.turns[1].results[0]
    assert reused.effect_key == service.charges[0][1]
    assert reused.output == {"receipt": "r-1"}


async def test_live_sends_the_repeat_to_the_service_under_a_new_key(url: str) -> None:
    service = PaymentService()
    with trio.fail_after(30):
        forked, _ = await fork_paid_run(url, service, "live")
    assert forked.outcome.reason is TerminalReason.COMPLETED
    assert len(service.charges) == 2
    assert service.charges[1][1] != service.charges[0][1]


async def test_deny_refuses_the_repeat_with_a_result_the_model_sees(url: str) -> None:
    service = PaymentService()
    with trio.fail_after(30):
        _, fork = await fork_paid_run(url, service, "deny")
    assert len(service.charges) == 1
    denied = fork.turns[1].results[0]
    assert denied.error is not None
    assert "writes=deny" in denied.error.message


async def test_a_fork_at_a_step_with_an_outcome_unknown_write_is_refused_and_writes_nothing(
    url: str, tmp_path: Path
) -> None:
    service = PaymentService()
    service.fail_with_unknown = True
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            outcome = await runtime.run(payer(service), "refund A-1", invocation_id="unknown")
            ids_before = await runtime.with_driver(
                lambda driver: driver.reads.call(driver.store.invocation_ids)
            )
            with pytest.raises(ForkRefusedError) as refused:
                await runtime.fork(
                    outcome.invocation_id,
                    at_step=2,
                    agent=payer(service, CHANGED_SCRIPT),
                    by="ops",
                    reason="try",
                )
            ids_after = await runtime.with_driver(
                lambda driver: driver.reads.call(driver.store.invocation_ids)
            )
    assert refused.value.refusal is ForkRefusal.OPEN_WRITE
    assert "reconcile" in str(refused.value)
    assert ids_after == ids_before


@pytest.mark.parametrize(
    ("at_step", "refusal"),
    [(9, ForkRefusal.STEP_PAST_END), (3, ForkRefusal.STEP_NOT_SETTLED)],
)
async def test_a_step_past_the_end_or_mid_turn_is_refused(
    url: str, at_step: int, refusal: ForkRefusal
) -> None:
    service = PaymentService()
    with trio.fail_after(30):
        source = await paid_source(url, service)
        async with Runtime(url) as runtime:
            with pytest.raises(ForkRefusedError) as refused:
                await runtime.fork(
                    source, at_step=at_step, agent=payer(service), by="ops", reason="x"
                )
    assert refused.value.refusal is refusal


async def test_last_failed_forks_before_the_step_that_failed(url: str) -> None:
    service = PaymentService()
    script = [
        *SOURCE_SCRIPT[:1],
        {"kind": "tool_calls", "calls": [{"id": "c2", "name": "pay", "arguments": {"x": 1}}]},
        {"kind": "final", "answer": "gave up"},
    ]
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            source = await runtime.run(payer(service, script), "refund A-1")
            forked = await runtime.fork(
                source.invocation_id, at_step="last-failed", by="ops", reason="x", run=False
            )
            with pytest.raises(ForkRefusedError) as nothing:
                await runtime.fork(
                    forked.fork_id, at_step="last-failed", by="ops", reason="x", run=False
                )
    assert forked.at_step == 1
    assert forked.outcome is None
    assert nothing.value.refusal is ForkRefusal.NO_FAILED_STEP


@pytest.mark.parametrize(
    "bad",
    [
        {"at_step": -1},
        {"at_step": "first"},
        {"by": ""},
        {"reason": "  "},
        {"writes": "sometimes"},
        {"fork_id": "eff-x"},
        {"agent": "not an agent"},
    ],
)
async def test_malformed_fork_arguments_are_usage_errors(url: str, bad: dict[str, Any]) -> None:
    service = PaymentService()
    arguments: dict[str, Any] = {
        "at_step": 1,
        "by": "ops",
        "reason": "x",
        "agent": payer(service),
        **bad,
    }
    with trio.fail_after(30):
        source = await paid_source(url, service)
        async with Runtime(url) as runtime:
            with pytest.raises(UsageError):
                await runtime.fork(source, **arguments)


def test_the_cli_forks_prints_json_and_refuses_with_exit_2(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = PaymentService()
    trio.run(paid_source, url, service)
    module = tmp_path / "fork_agents.py"
    module.write_text(
        "from tests.runtime.test_fork import PaymentService, payer, CHANGED_SCRIPT\n"
        "changed = payer(PaymentService(), CHANGED_SCRIPT)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(
        [
            "fork", "source", "--at-step", "1", "--agent", "fork_agents:changed",
            "--writes", "dedupe", "--by", "ops", "--reason", "try", "--id", "f1",
            "--json", "--db", url,
        ]
    )  # fmt: skip
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert document["fork_id"] == "f1"
    assert document["outcome"]["reason"] == "completed"
    code = main(
        ["fork", "source", "--at-step", "7", "--by", "ops", "--reason", "x", "--no-run",
         "--db", url]
    )  # fmt: skip
    assert code == 2
    assert "no step 7" in capsys.readouterr().err
    code = main(
        ["fork", "source", "--at-step", "1", "--by", "ops", "--reason", "x", "--no-run",
         "--id", "f2", "--db", url]
    )  # fmt: skip
    printed = capsys.readouterr().out.splitlines()
    assert code == 0
    assert printed[0] == (
        "forked f2 from source at step 1 (writes=approve; changed: nothing; "
        "1 write of the source after step 1)"
    )
    code = main(["audit", "verify", "--db", url])
    assert code == 0


CRASH_AGENTS = '''
import json, os
from loop_actors import Agent, Budget, ScriptedModel, ToolContext, tool
from tests.runtime.test_fork import CHANGED_SCRIPT, SOURCE_SCRIPT

def lookup(q: str) -> str:
    """Look an order up."""
    return q.upper()

def pay(amount: int, ctx: ToolContext) -> dict:
    """Charge the customer."""
    with open(os.environ["CHARGES_FILE"], "a") as charges:
        charges.write(json.dumps([amount, ctx.effect_key]) + "\\n")
    return {"receipt": "r-1"}

TOOLS = [tool(lookup), tool(effect="write")(pay)]
source = Agent("payer", ScriptedModel(SOURCE_SCRIPT), TOOLS, Budget(max_steps=10))
MIXED = [dict(CHANGED_SCRIPT[0]), {"kind": "tool_calls", "calls": [
    {"id": "x", "name": "pay", "arguments": {"amount": 40}},
    {"id": "y", "name": "lookup", "arguments": {"q": "a-2"}}]}, dict(CHANGED_SCRIPT[2])]
changed = Agent("payer", ScriptedModel(MIXED), TOOLS, Budget(max_steps=10))
'''


@pytest.mark.slow
def test_a_dedupe_fork_killed_after_its_dispatch_resumes_without_charging(tmp_path: Path) -> None:
    """The reused write's batch also reads: it is committed before the read runs, then killed."""
    (tmp_path / "crash_agents.py").write_text(CRASH_AGENTS)
    charges = tmp_path / "charges.jsonl"
    url = f"sqlite:///{tmp_path / 'store.db'}"
    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "CHARGES_FILE": str(charges),
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{repo}",
    }
    cli = [sys.executable, "-m", "loop_actors"]
    ran = subprocess.run(
        [*cli, "run", "crash_agents:source", "--goal", "refund A-1", "--id", "src", "--db", url],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    fork = [*cli, "fork", "src", "--at-step", "1", "--agent", "crash_agents:changed"]
    killed = subprocess.run(
        [*fork, "--writes", "dedupe", "--id", "f1", "--by", "ops", "--reason", "x", "--db", url],
        env={**env, "LOOP_ACTORS_CRASH_AT": "after_dispatch_commit:1"},
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = subprocess.run(
        [*cli, "resume", "f1", "--agent", "crash_agents:changed", "--json", "--db", url],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["reason"] == "completed"
    assert len(charges.read_text().splitlines()) == 1  # the source's charge only


def test_the_clis_writes_choices_are_the_fork_writes_values() -> None:
    """``--writes`` is spelt in the light options module; it must offer every ``ForkWrites``."""
    from aggregates.fork_origin import ForkWrites
    from loop_actors.cli.options.fork import WRITES

    assert tuple(choice.value for choice in ForkWrites) == WRITES


async def test_a_source_driven_by_another_runtime_is_refused_unless_taken_over(url: str) -> None:
    """Another runtime (another lease holder) drives the source: the fork waits for no one."""
    started, release = trio.Event(), trio.Event()

    async def lookup(q: str) -> str:
        """Look an order up, slowly."""
        started.set()
        await release.wait()
        return q.upper()

    async def held_row(runtime: Runtime) -> None:
        leases = runtime.driver.leases
        # The row of a new run is written just after its start, by another runtime: polled.
        while (row := await leases.call(leases.queue.row, "busy")) is None or row.holder is None:  # noqa: ASYNC110
            await trio.sleep(0.01)

    agent = Agent("payer", ScriptedModel(SOURCE_SCRIPT), [tool(lookup)])
    with trio.fail_after(30):
        async with Runtime(url) as driving, Runtime(url) as forking, trio.open_nursery() as n:
            n.start_soon(partial(driving.run, agent, "refund A-1", invocation_id="busy"))
            await started.wait()
            await held_row(forking)
            with pytest.raises(LeaseHeldError) as held:
                await forking.fork("busy", at_step=0, by="ops", reason="x", run=False)
            taken = await forking.fork(
                "busy", at_step=0, by="ops", reason="x", run=False, take_over=True
            )
            release.set()
    assert held.value.holder == driving.holder_id
    assert "--take-over" in str(held.value)
    assert taken.outcome is None
    assert taken.at_step == 0
