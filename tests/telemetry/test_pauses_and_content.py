"""An approval pause closes its drive; a resume is a new, linked drive; content stays out."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, tool
from loop_actors.telemetry import OTEL_ENV
from loop_actors.telemetry.spans import effect_key_hash, report, span_id_of
from tests.support.telemetry import attributes_of, in_memory_telemetry, times

CARD = "4111111111111111"
SECRET_ORDER = "order-7f3a-private"


@tool(effect="write", requires_approval=lambda arguments: arguments["amount"] > 100)
def refund(order_id: str, amount: int) -> str:
    """Refund an amount on an order; above 100 a person approves."""
    return f"refunded {amount}"


@tool(sensitive_arguments=["card_number"], sensitive_output=["token"])
def tokenize(card_number: str) -> dict[str, str]:
    """Exchange a card number for a token."""
    return {"token": "tok_" + card_number[-4:] + "_live", "last4": card_number[-4:]}


def decide(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "t", "name": "tokenize", "arguments": {"card_number": CARD}},
                {
                    "id": "r",
                    "name": "refund",
                    "arguments": {"order_id": SECRET_ORDER, "amount": 250},
                },
            ],
        }
    return {"kind": "final", "answer": "refunded the private order"}


AGENT = Agent("refunds", ScriptedModel(decide), [tokenize, refund])
GOAL = "refund the private order for card holder Jane"


async def paused_and_resumed(runtime: Runtime) -> None:
    paused = await runtime.run(AGENT, GOAL, invocation_id="ref-1")
    assert paused.reason == "approval_required"
    assert paused.digest is not None
    await runtime.approve("ref-1", digest=paused.digest, by="alice")
    resumed = await runtime.resume("ref-1", AGENT)
    assert resumed.reason == "completed"


async def test_an_approval_pause_ends_its_drive_without_an_error_and_no_span_spans_the_wait() -> (
    None
):
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            paused = await runtime.run(AGENT, GOAL, invocation_id="ref-1")
            during = captured.spans()
            assert paused.digest is not None
            await runtime.approve("ref-1", digest=paused.digest, by="alice")
            await runtime.resume("ref-1", AGENT)
            history = await runtime.history("ref-1")
        spans = captured.spans()
    [first] = [s for s in during if s.name == "invoke_agent refunds"]  # ended at the pause
    attributes = attributes_of(first)
    assert attributes["loop_actors.drive.end"] == "paused"
    assert attributes["loop_actors.terminal_reason"] == "approval_required"
    assert "error.type" not in attributes
    assert first.status.status_code is StatusCode.UNSET
    assert [event.name for event in first.events] == ["paused"]
    approved_at = next(e for e in history if type(e).__name__ == "ApprovalGranted").timestamp
    approved_ns = int(approved_at.timestamp() * 1_000_000) * 1000
    assert all(not (times(s)[0] <= approved_ns <= times(s)[1]) for s in spans)


async def test_the_resumed_drive_is_linked_to_the_paused_one_and_says_how_long_it_waited() -> None:
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            await paused_and_resumed(runtime)
        spans = captured.spans()
        points = captured.metrics()
    drives = sorted(
        (s for s in spans if s.name == "invoke_agent refunds"),
        key=lambda s: attributes_of(s)["loop_actors.drive"],
    )
    assert len(drives) == 2
    first, second = drives
    assert first.context.trace_id == second.context.trace_id
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    attributes = attributes_of(second)
    assert attributes["loop_actors.resumed_from"] == f"{first.context.span_id:016x}"
    assert attributes["loop_actors.invocation.paused.duration"] > 0
    assert attributes["loop_actors.terminal_reason"] == "completed"
    assert [event.name for event in second.events] == ["resumed"]
    assert second.context.span_id == span_id_of("ref-1", "drive", "1")
    assert times(first)[1] < times(second)[0]
    [(_, waited, count)] = points["loop_actors.approval.wait"]
    assert count == 1
    assert waited > 0
    [(run_attributes, runs, _)] = points["loop_actors.invocation.runs"]
    assert (run_attributes["loop_actors.terminal_reason"], runs) == ("completed", 1)


async def test_nothing_exported_by_default_holds_a_goal_argument_secret_answer_or_effect_key() -> (
    None
):
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            await paused_and_resumed(runtime)
            history = await runtime.history("ref-1")
        exported = captured.serialized()
    keys = [
        call.effect_key
        for event in history
        for call in getattr(event, "calls", None) or []
        if getattr(call, "effect_key", None)
    ]
    assert keys  # the refund is a write with a key
    forbidden = [CARD, CARD[-4:], "tok_", SECRET_ORDER, "Jane", "refunded", *keys]
    assert [word for word in forbidden if word in exported] == []
    assert effect_key_hash(keys[0]) in exported  # the hash stands in for the key


async def test_content_on_shows_what_is_stored_and_a_redacted_value_still_never_appears(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOOP_ACTORS_OTEL_CONTENT", "on")
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            await paused_and_resumed(runtime)
        exported = captured.serialized()
    assert SECRET_ORDER in exported  # an ordinary argument, asked for
    assert GOAL in exported
    assert CARD not in exported  # redacted in the store, so in every span
    assert "tok_1111_live" not in exported


async def test_with_otel_off_nothing_is_exported_though_the_application_configured_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(OTEL_ENV, "off")
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            await paused_and_resumed(runtime)
            started = (await runtime.history("ref-1"))[0]
        assert captured.spans() == []
        assert captured.metrics() == {}
    assert started.trace_parent is None  # type: ignore[attr-defined]


def test_a_run_without_a_configured_sdk_imports_no_opentelemetry() -> None:
    script = textwrap.dedent(
        """
        import sys, trio
        from loop_actors import Agent, Runtime, ScriptedModel

        async def main():
            agent = Agent("quiet", ScriptedModel([{"kind": "final", "answer": "ok"}]))
            async with Runtime("memory://") as runtime:
                outcome = await runtime.run(agent, "say ok")
            assert outcome.reason == "completed", outcome
            loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
            print(loaded)

        trio.run(main)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


async def test_the_applications_sampler_decides_which_runs_are_traced() -> None:
    with in_memory_telemetry(metrics_only=True) as captured, trio.fail_after(10):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=ALWAYS_OFF)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        async with Runtime("memory://") as runtime:
            await paused_and_resumed(runtime)
        assert exporter.get_finished_spans() == ()
        assert "loop_actors.invocation.runs" in captured.metrics()  # metrics are not sampled


async def test_a_paused_run_cancelled_is_reported_ended_as_a_re_export_reports_it() -> None:
    """The ``Terminated`` that ``cancel`` commits for a paused run closes a drive of its own.

    It is reported live by the process that cancelled, once: the run is counted in
    ``loop_actors.invocation.runs`` as ``cancelled``, and the span is the one that
    ``trace export`` rebuilds from the history (same ids).
    """
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            paused = await runtime.run(AGENT, GOAL, invocation_id="ref-1")
            assert paused.reason == "approval_required"
            await runtime.request_cancel("ref-1", by="bob", reason="duplicate")
            await runtime.request_cancel("ref-1", by="bob")  # already ended: nothing more
            history = await runtime.history("ref-1")
        spans = captured.spans()
        points = captured.metrics()
    drives = sorted(
        (s for s in spans if s.name == "invoke_agent refunds"),
        key=lambda s: attributes_of(s)["loop_actors.drive"],
    )
    assert [attributes_of(s)["loop_actors.drive.end"] for s in drives] == ["paused", "ended"]
    ended = attributes_of(drives[1])
    assert ended["loop_actors.terminal_reason"] == "cancelled"
    assert "error.type" not in ended
    assert [link.context.span_id for link in drives[1].links] == [drives[0].context.span_id]
    rebuilt = report(history, root_trace_parent=None, content=False)
    assert {(r.span_id, r.name) for r in rebuilt.spans if r.name.startswith("invoke_agent")} == {
        (s.context.span_id, s.name) for s in drives
    }
    runs = points["loop_actors.invocation.runs"]
    assert [(a["loop_actors.terminal_reason"], value) for a, value, _ in runs] == [
        ("cancelled", 1.0)
    ]


@pytest.mark.parametrize(
    "opt_in", ["gen_ai_latest_experimental", "http, gen_ai_latest_experimental", "database"]
)
async def test_the_semconv_opt_in_names_the_pause_events_and_counts_usage_as_the_drafts_do(
    opt_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` (alone or in a list).

    The pause and resume span events take PR #445's names, and each model call is also
    counted in the draft's ``gen_ai.client.inference.usage.*`` counters; the default
    names and points stay as they are. Another opt-in value changes nothing.
    """
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in)
    latest = "gen_ai_latest_experimental" in opt_in
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            await paused_and_resumed(runtime)
        spans = captured.spans()
        points = captured.metrics()
    drives = sorted(
        (s for s in spans if s.name == "invoke_agent refunds"),
        key=lambda s: attributes_of(s)["loop_actors.drive"],
    )
    names = [[event.name for event in drive.events] for drive in drives]
    if latest:
        assert names == [["gen_ai.agent.paused"], ["gen_ai.agent.resumed"]]
    else:
        assert names == [["paused"], ["resumed"]]
    usage = points["gen_ai.client.token.usage"]
    inputs = sum(total for a, total, _ in usage if a["gen_ai.token.type"] == "input")
    drafted = points.get("gen_ai.client.inference.usage.input_tokens", [])
    if latest:
        assert [(a["gen_ai.token.modality"], total) for a, total, _ in drafted] == [
            ("text", inputs)
        ]
        assert "gen_ai.client.inference.usage.output_tokens" in points
    else:
        assert drafted == []
