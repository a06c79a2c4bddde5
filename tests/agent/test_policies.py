"""Loop policies: approvals, clarification, the doom-loop guard and the verification gate."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from aggregates.invocation import ApprovalDenied, ApprovalGranted, VerificationFailed
from loop_actors import (
    Agent,
    ApprovalRefusedError,
    Budget,
    ErrorClass,
    ModelRequest,
    NotWaitingError,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolError,
    tool,
)
from tests.support.cli import CLI, cli_env, run_cli
from tests.support.replies import calls, final

pytestmark = pytest.mark.slow


class Ledger:
    """Counts what really ran."""

    def __init__(self) -> None:
        self.refunds: list[int] = []
        self.lookups = 0


def refund_agent(ledger: Ledger, script: Any, **agent_options: Any) -> Agent:
    @tool(
        effect="write",
        reconcile=lambda key: Reconciled(status="not_found"),
        requires_approval=lambda args: args["amount"] > 100,
    )
    async def refund(amount: int) -> dict[str, int]:
        """Refund an amount; above 100 a person must approve."""
        ledger.refunds.append(amount)
        return {"refunded": amount}

    @tool
    async def lookup(key: str) -> str:
        """Read something."""
        ledger.lookups += 1
        if key == "broken":
            raise ToolError("backend down", error_class=ErrorClass.UNAVAILABLE)
        return key

    model = script if isinstance(script, ScriptedModel) else ScriptedModel(script)
    return Agent("refunds", model, [refund, lookup], **agent_options)


BIG_BATCH = calls(
    ("r1", "refund", {"amount": 250}),
    ("r2", "refund", {"amount": 20}),
    ("r3", "refund", {"amount": 900}),
)


async def test_a_call_that_needs_approval_pauses_with_the_digest_and_the_calls(db_url: str) -> None:
    ledger = Ledger()
    outcome = await Runtime(db_url).run(refund_agent(ledger, [BIG_BATCH, final("done")]), "g")
    assert outcome.reason is TerminalReason.APPROVAL_REQUIRED
    assert outcome.exit_code == 3
    assert outcome.digest
    assert outcome.pending_calls is not None
    assert [(c["call_id"], c["needs_approval"]) for c in outcome.pending_calls] == [
        ("r1", True),
        ("r2", False),
        ("r3", True),
    ]
    assert ledger.refunds == []  # nothing ran, not even the call that needed no approval


async def test_approve_then_resume_runs_the_approved_batch_once(db_url: str) -> None:
    ledger = Ledger()
    agent = refund_agent(ledger, [BIG_BATCH, final("done")])
    paused = await Runtime(db_url).run(agent, "g", invocation_id="inv")
    assert paused.digest is not None
    runtime = Runtime(db_url)
    await runtime.approve("inv", digest=paused.digest, by="alice", note="checked the order")
    outcome = await runtime.resume("inv", agent)
    again = await runtime.resume("inv", agent)
    assert outcome.reason is TerminalReason.COMPLETED
    assert again == outcome
    assert ledger.refunds == [250, 20, 900]
    granted = [e for e in await runtime.history("inv") if isinstance(e, ApprovalGranted)]
    assert [(g.by, g.note) for g in granted] == [("alice", "checked the order")]


async def test_a_stale_or_mismatched_digest_is_refused(db_url: str) -> None:
    ledger = Ledger()
    agent = refund_agent(ledger, [BIG_BATCH])
    await Runtime(db_url).run(agent, "g", invocation_id="inv")
    with pytest.raises(ApprovalRefusedError):
        await Runtime(db_url).approve("inv", digest="0" * 64, by="mallory")
    assert ledger.refunds == []


async def test_a_denial_is_a_denied_result_the_model_cannot_turn_into_permission(
    db_url: str,
) -> None:
    ledger = Ledger()
    seen: list[Any] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return BIG_BATCH
        if request.step == 2:
            seen.extend(request.results)
            # The model tries again with the same refund.
            return calls(("r4", "refund", {"amount": 250}))
        return final("gave up")

    agent = refund_agent(ledger, decide)
    await Runtime(db_url).run(agent, "g", invocation_id="inv")
    runtime = Runtime(db_url)
    await runtime.deny("inv", by="bob", reason="over the limit for this customer")
    outcome = await runtime.resume("inv", agent)
    assert ledger.refunds == [20]  # only the call that needed no approval
    by_id = {r.call_id: r for r in seen}
    assert by_id["r1"].error.error_class is ErrorClass.DENIED
    assert by_id["r3"].error.error_class is ErrorClass.DENIED
    assert by_id["r2"].ok
    # Asking again is a new proposal: it needs a new approval.
    assert outcome.reason is TerminalReason.APPROVAL_REQUIRED
    denied = [e for e in await runtime.history("inv") if isinstance(e, ApprovalDenied)]
    assert denied[0].reason == "over the limit for this customer"


async def test_a_pause_survives_a_restart_and_approval_works_from_the_cli(tmp_path: Path) -> None:
    app = tmp_path / "refunds_app.py"
    app.write_text(
        "from loop_actors import Agent, Reconciled, ScriptedModel, tool\n"
        "@tool(effect='write', reconcile=lambda k: Reconciled(status='not_found'),\n"
        "      requires_approval=lambda a: a['amount'] > 100)\n"
        "def refund(amount: int) -> dict:\n"
        "    '''Refund.'''\n"
        "    with open('refunds.log', 'a') as f:\n"
        "        f.write(f'{amount}\\n')\n"
        "    return {'refunded': amount}\n"
        "agent = Agent('refunds', ScriptedModel([\n"
        "    {'kind': 'tool_calls', 'calls': [{'id': 'r', 'name': 'refund', 'arguments': {'amount': 500}}]},\n"
        "    {'kind': 'final', 'answer': 'refunded'}]), [refund])\n"
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, cwd=tmp_path, timeout=60)

    paused = cli("run", "refunds_app:agent", "--goal", "refund", "--id", "r1", "--json")
    assert paused.returncode == 3, paused.stderr
    record = json.loads(paused.stdout)
    assert record["reason"] == "approval_required"
    assert record["pending_calls"][0]["arguments"] == {"amount": 500}
    wrong = cli("approve", "r1", "--digest", "nope", "--by", "eve")
    assert wrong.returncode == 2
    assert "refused" in wrong.stderr
    approved = cli(
        "approve", "r1", "--digest", record["digest"], "--by", "alice", "--note", "ok",
        "--agent", "refunds_app:agent", "--json",
    )  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["reason"] == "completed"
    assert (tmp_path / "refunds.log").read_text() == "500\n"
    history = cli("history", "r1", "--json")
    granted = [json.loads(x) for x in history.stdout.splitlines() if '"ApprovalGranted"' in x]
    assert granted[0]["data"]["by"] == "alice"


async def test_clarification_answer_resumes_with_the_answer_in_view(db_url: str) -> None:
    seen: list[Any] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {"kind": "clarification", "question": "Which order?"}
        seen.append(request.turns[-1].reply)
        return final("order 7 it is")

    agent = Agent("asker", ScriptedModel(decide))
    runtime = Runtime(db_url)
    paused = await runtime.run(agent, "g", invocation_id="q")
    assert paused.reason is TerminalReason.CLARIFICATION_REQUIRED
    with pytest.raises(ApprovalRefusedError):
        await runtime.approve("q", digest="x", by="a")
    await runtime.clarify("q", answer="order 7", by="carol")
    outcome = await runtime.resume("q", agent)
    assert outcome.reason is TerminalReason.COMPLETED
    assert seen == ["order 7"]
    with pytest.raises(NotWaitingError):
        await runtime.clarify("q", answer="again")


async def test_three_identical_failures_end_in_repeated_failure() -> None:
    ledger = Ledger()
    agent = refund_agent(
        ledger,
        lambda r: calls((f"c{r.step}", "lookup", {"key": "broken"})),
        max_repeated_failures=3,
        budget=Budget(max_repeated_plan=10),
    )
    outcome = await Runtime("memory://").run(agent, "g")
    assert outcome.reason is TerminalReason.REPEATED_FAILURE
    assert ledger.lookups == 3


async def test_alternating_failures_do_not_trigger_the_guard() -> None:
    ledger = Ledger()

    @tool
    async def other(key: str) -> str:
        """Fail differently."""
        raise ToolError("nope", error_class=ErrorClass.UNAVAILABLE)

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step > 6:
            return final("stop")
        name = "lookup" if request.step % 2 else "other"
        return calls((f"c{request.step}", name, {"key": "broken"}))

    agent = refund_agent(ledger, decide, budget=Budget(max_repeated_plan=10))
    agent.toolbox.tools["other"] = other
    outcome = await Runtime("memory://").run(agent, "g")
    assert outcome.reason is TerminalReason.COMPLETED


async def test_a_success_clears_the_failure_streak() -> None:
    ledger = Ledger()
    keys = ["broken", "broken", "fine", "broken", "broken"]

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step > len(keys):
            return final("stop")
        return calls((f"c{request.step}", "lookup", {"key": keys[request.step - 1]}))

    agent = refund_agent(ledger, decide, budget=Budget(max_repeated_plan=10))
    outcome = await Runtime("memory://").run(agent, "g")
    assert outcome.reason is TerminalReason.COMPLETED


async def test_a_failed_verification_goes_back_to_the_model_then_passes(db_url: str) -> None:
    evidence_seen: list[Any] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return final("42 apples")
        evidence_seen.append(request.turns[-1].verification)
        return final("42 pears")

    def verifier(answer: str, turns: list[Any]) -> bool | str:
        return True if "pears" in answer else "the goal asked about pears"

    agent = Agent("v", ScriptedModel(decide), verifier=verifier)
    runtime = Runtime(db_url)
    outcome = await runtime.run(agent, "how many pears?", invocation_id="v")
    assert (outcome.reason, outcome.answer) == (TerminalReason.COMPLETED, "42 pears")
    assert evidence_seen == ["the goal asked about pears"]
    failed = [e for e in await runtime.history("v") if isinstance(e, VerificationFailed)]
    assert [f.evidence for f in failed] == ["the goal asked about pears"]


async def test_verification_failing_every_attempt_ends_in_verification_failed() -> None:
    agent = Agent(
        "v",
        ScriptedModel(lambda r: final("wrong")),
        verifier=lambda answer, turns: False,
        max_verification_attempts=2,
    )
    outcome = await Runtime("memory://").run(agent, "g")
    assert outcome.reason is TerminalReason.VERIFICATION_FAILED
    assert outcome.steps == 2


SLOW_APP = '''
import os, time
from loop_actors import Agent, Budget, Reconciled, ScriptedModel, tool

@tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"), timeout_s=60)
def slow_write(name: str) -> str:
    """A write that takes a while."""
    with open(f"started-{name}", "w") as marker:
        marker.write("x")
    time.sleep(30)
    return name

agent = Agent("slow", ScriptedModel([
    {"kind": "tool_calls", "calls": [
        {"id": "w1", "name": "slow_write", "arguments": {"name": "first"}},
        {"id": "w2", "name": "slow_write", "arguments": {"name": "second"}},
    ]},
    {"kind": "final", "answer": "wrote both"},
]), [slow_write], Budget())
'''


def test_cancel_from_another_process_stops_a_slow_write_and_starts_no_new_call(
    tmp_path: Path,
) -> None:
    import time

    (tmp_path / "slow_app.py").write_text(SLOW_APP)
    running = subprocess.Popen(
        [*CLI, "run", "slow_app:agent", "--goal", "write", "--id", "s1", "--json"],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started-first").exists():
            assert time.monotonic() < deadline, "the write never started"
            assert running.poll() is None, running.communicate()
            time.sleep(0.05)
        asked = time.monotonic()
        cancel = run_cli(
            "cancel", "s1", "--by", "ops", "--reason", "wrong customer", cwd=tmp_path, timeout=60
        )
        assert cancel.returncode == 0, cancel.stderr
        assert "requested" in cancel.stdout
        out, err = running.communicate(timeout=30)
        stopped_after = time.monotonic() - asked
    finally:
        if running.poll() is None:
            running.kill()
    assert running.returncode == 4, err
    assert json.loads(out)["reason"] == "cancelled"
    assert stopped_after < 15  # noticed within the poll period, not after the 30 s write
    assert not (tmp_path / "started-second").exists()
    history = run_cli("history", "s1", "--json", cwd=tmp_path, timeout=60)
    results = next(
        json.loads(line)["data"]["results"]
        for line in history.stdout.splitlines()
        if json.loads(line)["type"] == "ResultsCommitted"
    )
    assert results[0]["effect_status"] == "outcome_unknown"
    assert results[1]["error"]["error_class"] == "cancelled"


async def test_cancelling_a_paused_invocation_ends_it(db_url: str) -> None:
    from loop_actors.runtime.runtime import CancelResult

    ledger = Ledger()
    runtime = Runtime(db_url)
    await runtime.run(refund_agent(ledger, [BIG_BATCH]), "g", invocation_id="p")
    assert await runtime.request_cancel("p", by="ops") is CancelResult.ENDED
    invocation = await runtime.load("p")
    assert invocation.terminated is not None
    assert invocation.terminated.reason is TerminalReason.CANCELLED
    assert await runtime.request_cancel("p") is CancelResult.ALREADY_ENDED


READS_APP = """
from loop_actors import Agent, ScriptedModel, tool

@tool
def look(key: str) -> str:
    "Read."
    with open("reads.log", "a") as log:
        log.write(key + "\\n")
    return key

agent = Agent("reads", ScriptedModel([
    {"kind": "tool_calls", "calls": [{"id": "a", "name": "look", "arguments": {"key": "one"}}]},
    {"kind": "tool_calls", "calls": [{"id": "b", "name": "look", "arguments": {"key": "two"}}]},
    {"kind": "final", "answer": "read both"},
]), [look])
"""


def test_a_cancel_requested_while_nothing_runs_ends_the_invocation_on_resume(
    tmp_path: Path,
) -> None:
    (tmp_path / "reads_app.py").write_text(READS_APP)

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, cwd=tmp_path, env=extra, timeout=60)

    crashed = cli(
        "run", "reads_app:agent", "--goal", "g", "--id", "r",
        LOOP_ACTORS_CRASH_AT="after_dispatch_commit:2",
    )  # fmt: skip
    assert crashed.returncode == -9
    cancel = cli("cancel", "r", "--by", "ops")
    assert "requested" in cancel.stdout
    resumed = cli("resume", "r", "--agent", "reads_app:agent", "--json")
    assert resumed.returncode == 4, resumed.stderr
    assert json.loads(resumed.stdout)["reason"] == "cancelled"
    # The read of the dispatched batch was not run again after the cancel.
    assert (tmp_path / "reads.log").read_text() == "one\n"


def _usage_model(tokens_per_call: int, cost: float = 0.0) -> ScriptedModel:
    from loop_actors import Usage

    def decide(request: ModelRequest) -> dict[str, Any]:
        return calls((f"c{request.step}", "lookup", {"key": str(request.step)}))

    return ScriptedModel(
        decide, usage=Usage(input_tokens=tokens_per_call, output_tokens=0, cost=cost)
    )


async def test_the_token_budget_stops_before_the_call_that_would_exceed_it() -> None:
    asked: list[int] = []
    model = _usage_model(400)
    original = model.decide

    async def counting(request: ModelRequest) -> Any:
        asked.append(request.step)
        return await original(request)

    model.decide = counting  # type: ignore[method-assign]
    agent = Agent(
        "t",
        model,
        refund_agent(Ledger(), []).toolbox.tools.values(),
        Budget(max_tokens=1000, reserve_tokens=400, max_repeated_plan=10),
    )
    outcome = await Runtime("memory://").run(agent, "g")
    assert outcome.reason is TerminalReason.TOKEN_BUDGET_EXHAUSTED
    assert asked == [1, 2]  # a third call could have reached 1,200 tokens: never made
    assert outcome.detail is not None
    assert "800 of 1000" in outcome.detail


async def test_the_cost_budget_uses_the_price_table_and_stops_before_exceeding() -> None:
    from loop_actors import Price

    agent = Agent(
        "c",
        _usage_model(1_000_000),  # a million input tokens a call
        refund_agent(Ledger(), []).toolbox.tools.values(),
        Budget(max_cost=2.5, reserve_cost=1.0, max_repeated_plan=10),
        price=Price(input_per_million=1.0),
    )
    outcome = await Runtime("memory://").run(agent, "g")
    assert outcome.reason is TerminalReason.COST_BUDGET_EXHAUSTED
    assert outcome.steps == 2  # 2.0 spent; the third call's reservation would pass 2.5


async def test_the_wind_down_notice_appears_at_the_configured_point() -> None:
    notices: list[list[str]] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        notices.append(list(request.notices))
        if request.step == 5:
            return final("summary")
        return calls((f"c{request.step}", "lookup", {"key": str(request.step)}))

    agent = Agent(
        "w",
        ScriptedModel(decide),
        refund_agent(Ledger(), []).toolbox.tools.values(),
        Budget(max_steps=5, wind_down_steps=2),
        wind_down_notice="{steps_left} left: wrap up",
    )
    outcome = await Runtime("memory://").run(agent, "g")
    assert outcome.reason is TerminalReason.COMPLETED
    assert notices == [[], [], [], ["2 left: wrap up"], ["1 left: wrap up"]]


def _order_tools(ledger: Ledger) -> list[Any]:
    @tool(effect="write", operation="refund", object_from="order_id")
    async def refund_order(order_id: str, amount: int) -> str:
        """Refund an order."""
        ledger.refunds.append(amount)
        return order_id

    @tool(operation="read", object_from="order_id")
    async def read_order(order_id: str) -> str:
        """Read an order."""
        ledger.lookups += 1
        return order_id

    return [refund_order, read_order]


def _policy(request: Any) -> Any:
    from loop_actors import Deny

    if request.operation == "read":
        return True
    if request.tenant != "acme" or not str(request.object).startswith("acme-"):
        return Deny(reason=f"{request.actor} may not refund {request.object} for {request.tenant}")
    return request.actor == "alice"


async def test_a_call_outside_permissions_is_refused_before_it_runs() -> None:
    from loop_actors import AccessRequest

    ledger = Ledger()
    seen: list[Any] = []
    requests: list[AccessRequest] = []

    def policy(request: AccessRequest) -> Any:
        requests.append(request)
        return _policy(request)

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return calls(
                ("a", "read_order", {"order_id": "other-1"}),
                ("b", "refund_order", {"order_id": "other-1", "amount": 5}),
                ("c", "refund_order", {"order_id": "acme-7", "amount": 9}),
            )
        seen.extend(request.results)
        return final("done")

    agent = Agent("orders", ScriptedModel(decide), _order_tools(ledger), policy=policy)
    outcome = await Runtime("memory://").run(agent, "g", actor="alice", tenant="acme")
    assert outcome.reason is TerminalReason.COMPLETED
    assert ledger.refunds == [9]
    assert ledger.lookups == 1
    by_id = {r.call_id: r for r in seen}
    assert by_id["b"].error.error_class is ErrorClass.DENIED
    assert "may not refund other-1" in by_id["b"].error.message
    assert by_id["a"].ok
    assert by_id["c"].ok
    assert [(r.operation, r.object, r.actor, r.tenant) for r in requests] == [
        ("read", "other-1", "alice", "acme"),
        ("refund", "other-1", "alice", "acme"),
        ("refund", "acme-7", "alice", "acme"),
    ]


async def test_a_policy_can_end_the_run_instead() -> None:
    from loop_actors import Deny

    ledger = Ledger()
    agent = Agent(
        "orders",
        ScriptedModel([calls(("b", "refund_order", {"order_id": "x", "amount": 5}))]),
        _order_tools(ledger),
        policy=lambda request: Deny(reason="tenant suspended", stop=True),
    )
    outcome = await Runtime("memory://").run(agent, "g", actor="bob", tenant="acme")
    assert outcome.reason is TerminalReason.INVALID_DECISION
    assert outcome.detail is not None
    assert "tenant suspended" in outcome.detail
    assert ledger.refunds == []


async def test_a_policy_that_raises_refuses() -> None:
    ledger = Ledger()

    def broken(request: Any) -> bool:
        raise RuntimeError("policy store down")

    agent = Agent(
        "orders",
        ScriptedModel([calls(("b", "refund_order", {"order_id": "x", "amount": 5})), final("ok")]),
        _order_tools(ledger),
        policy=broken,
    )
    outcome = await Runtime("memory://").run(agent, "g")
    assert outcome.reason is TerminalReason.COMPLETED
    assert ledger.refunds == []


async def test_compaction_keeps_the_plan_the_recent_turns_and_records_what_it_did() -> None:
    from aggregates.invocation import ContextCompacted

    seen: list[tuple[list[int], list[str]]] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        seen.append(([turn.step for turn in request.turns], list(request.notices)))
        if request.step == 12:
            return final("done")
        return calls((f"c{request.step}", "lookup", {"key": "x" * 200 + str(request.step)}))

    agent = Agent(
        "long",
        ScriptedModel(decide),
        refund_agent(Ledger(), []).toolbox.tools.values(),
        Budget(max_steps=12, max_repeated_plan=20),
        context_limit=3000,
        keep_recent_turns=3,
    )
    runtime = Runtime("memory://")
    async with runtime:
        outcome = await runtime.run(agent, "g", invocation_id="long")
        events = await runtime.history("long")
    assert outcome.reason is TerminalReason.COMPLETED
    last_view, notices = seen[-1]
    assert last_view[0] == 1  # the plan
    assert last_view[-3:] == [9, 10, 11]  # the recent turns
    assert len(last_view) < 11
    assert "left out" in notices[0]
    compacted = [e for e in events if isinstance(e, ContextCompacted)]
    assert compacted
    assert compacted[-1].kept_steps == last_view
    assert compacted[-1].size_after <= 3000 < compacted[-1].size_before


async def test_approving_a_models_own_request_for_approval_lets_it_decide_again(
    db_url: str,
) -> None:
    seen: list[Any] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {"kind": "request_approval", "proposal_digest": "plan-7", "summary": "do it"}
        seen.append(request.turns[-1].approval)
        return final("went ahead")

    agent = Agent("asker", ScriptedModel(decide))
    runtime = Runtime(db_url)
    paused = await runtime.run(agent, "g", invocation_id="a")
    assert paused.digest == "plan-7"
    await runtime.approve("a", digest="plan-7", by="dana")
    outcome = await runtime.resume("a", agent)
    assert outcome.reason is TerminalReason.COMPLETED
    assert seen == ["approved by dana"]


async def test_who_cancelled_and_why_is_in_the_recorded_end(db_url: str) -> None:
    import trio

    started = trio.Event()

    @tool
    async def wait(key: str) -> str:
        """Wait to be cancelled."""
        started.set()
        await trio.sleep_forever()
        return key

    agent = Agent("w", ScriptedModel([calls(("w", "wait", {"key": "k"}))]), [wait])
    async with Runtime(db_url) as runtime, trio.open_nursery() as nursery:
        outcomes: list[Any] = []

        async def go() -> None:
            outcomes.append(await runtime.run(agent, "g", invocation_id="x"))

        nursery.start_soon(go)
        await started.wait()
        await runtime.request_cancel("x", by="ops", reason="wrong customer")
    assert outcomes[0].reason is TerminalReason.CANCELLED
    assert "requested by ops (wrong customer)" in outcomes[0].detail


async def test_a_policy_that_changes_the_arguments_it_is_shown_changes_nothing_that_runs() -> None:
    from aggregates.invocation import BatchDispatched

    received: list[dict[str, Any]] = []

    @tool
    async def tag(labels: dict[str, list[str]]) -> dict[str, list[str]]:
        """Tag with labels."""
        received.append(labels)
        return labels

    def meddling(request: Any) -> bool:
        request.arguments["labels"]["colour"].append("changed by the policy")
        request.arguments["labels"]["extra"] = ["added"]
        return True

    proposed = {"colour": ["red"]}
    agent = Agent(
        "tags",
        ScriptedModel(
            [
                calls(("t", "tag", {"labels": proposed})),
                calls(("u", "tag", {"labels": proposed})),
                final("ok"),
            ]
        ),
        [tag],
        budget=Budget(max_repeated_plan=3),
        policy=meddling,
    )
    runtime = Runtime("memory://")
    async with runtime:
        outcome = await runtime.run(agent, "g", invocation_id="tags-1")
        events = await runtime.history("tags-1")
        replayed = await runtime.load("tags-1")
    assert outcome.reason is TerminalReason.COMPLETED
    assert received == [{"colour": ["red"]}, {"colour": ["red"]}]
    dispatched = [e for e in events if isinstance(e, BatchDispatched)]
    assert [e.calls[0].arguments for e in dispatched] == [{"labels": {"colour": ["red"]}}] * 2
    # The same plan twice in a row, judged on what ran.
    assert replayed.repeat_streak == 2
