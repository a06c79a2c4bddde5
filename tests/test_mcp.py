"""Tools from a real MCP server (tests/mcp_server_app.py), over stdio and streamable HTTP."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.invocation import ResultsCommitted
from loop_actors import (
    Agent,
    EffectStatus,
    ErrorClass,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolDefinitionError,
    ToolEffect,
    ToolError,
    UsageError,
)
from loop_actors._mcp import (
    HttpServer,
    McpTool,
    StdioServer,
    call_mcp_tool,
    mcp_tools,
    mcp_tools_async,
)
from loop_actors._tools import Reconciled

SERVER_APP = Path(__file__).with_name("mcp_server_app.py")
SERVER = StdioServer(command=sys.executable, args=[str(SERVER_APP)])


@pytest.fixture(scope="module")
def tools() -> dict[str, McpTool]:
    """The test server's tools, listed once over stdio."""
    listed = mcp_tools(SERVER)
    assert all(isinstance(t, McpTool) for t in listed)
    return {t.name: t for t in listed if isinstance(t, McpTool)}


def calls(*items: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "tool_calls",
        "calls": [{"id": i, "name": n, "arguments": a} for i, n, a in items],
    }


FINAL = {"kind": "final", "answer": "done"}


async def run(agent: Agent) -> tuple[Any, list[Any]]:
    async with Runtime("memory://") as runtime:
        outcome = await runtime.run(agent, "g", invocation_id="inv")
        events = await runtime.history("inv")
    return outcome, events


def results_of(events: list[Any]) -> list[Any]:
    return [r for e in events if isinstance(e, ResultsCommitted) for r in e.results]


# --------------------------------------------------------------------------- listing


def test_listing_maps_annotations_to_effects(tools: dict[str, McpTool]) -> None:
    assert list(tools) == ["stock", "echo", "set_label", "delete_item"]
    assert tools["stock"].effect is ToolEffect.READ  # readOnlyHint
    assert tools["stock"].reconcile is None
    assert tools["echo"].effect is ToolEffect.WRITE  # unannotated: a write, the safe default
    assert tools["echo"].reconcile is None
    assert tools["delete_item"].effect is ToolEffect.WRITE  # idempotent but destructive
    assert tools["delete_item"].reconcile is None


def test_an_idempotent_non_destructive_write_is_reconciled_as_not_found(
    tools: dict[str, McpTool],
) -> None:
    set_label = tools["set_label"]
    assert set_label.effect is ToolEffect.WRITE
    assert set_label.reconcile is not None
    assert set_label.reconcile("any-key") == Reconciled(status="not_found")


def test_a_tool_keeps_the_servers_name_description_and_input_schema(
    tools: dict[str, McpTool],
) -> None:
    echo = tools["echo"]
    assert echo.description.startswith("Say the text back")
    assert echo.schema["required"] == ["text"]
    assert echo.schema["properties"]["times"] == {
        "default": 1,
        "title": "Times",
        "type": "integer",
    }


def test_include_keeps_only_the_named_tools() -> None:
    listed = mcp_tools(SERVER, include=["stock"])
    assert [t.name for t in listed] == ["stock"]


def test_include_naming_an_unknown_tool_is_a_definition_error() -> None:
    with pytest.raises(ToolDefinitionError, match="has no tool named nope"):
        mcp_tools(SERVER, include=["nope"])


def test_a_server_command_that_does_not_exist_raises_a_definition_error() -> None:
    with pytest.raises(ToolDefinitionError, match="cannot list the tools of MCP server"):
        mcp_tools(StdioServer(command="loop-actors-no-such-mcp-server"))


async def test_mcp_tools_inside_a_trio_loop_says_to_use_the_async_variant() -> None:
    with pytest.raises(UsageError, match="mcp_tools_async"):
        mcp_tools(SERVER)


async def test_mcp_tools_async_lists_inside_a_trio_loop() -> None:
    listed = await mcp_tools_async(SERVER, include=["echo"])
    assert [t.name for t in listed] == ["echo"]


def test_arguments_are_checked_against_the_json_schema(tools: dict[str, McpTool]) -> None:
    echo = tools["echo"]
    assert echo.validate({"text": "hi"}).model_dump(mode="json") == {"text": "hi"}
    with pytest.raises(ValueError, match="'text' is a required property"):
        echo.validate({"times": 2})
    with pytest.raises(ValueError, match="'2' is not of type 'integer'"):
        echo.validate({"text": "hi", "times": "2"})


# --------------------------------------------------------------------------- calls


async def test_an_agent_runs_a_read_through_the_server_and_commits_its_structured_output(
    tools: dict[str, McpTool],
) -> None:
    script = [calls(("s1", "stock", {"item": "apple"})), FINAL]
    outcome, events = await run(Agent("shop", ScriptedModel(script), [tools["stock"]]))
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = results_of(events)
    assert result.error is None
    assert result.output == {"item": "apple", "count": 3}


async def test_a_write_returns_the_servers_text_and_is_committed(
    tools: dict[str, McpTool],
) -> None:
    script = [calls(("e1", "echo", {"text": "hi", "times": 2})), FINAL]
    outcome, events = await run(Agent("echo", ScriptedModel(script), [tools["echo"]]))
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = results_of(events)
    assert result.output == "hi hi"
    assert result.effect_status is EffectStatus.COMMITTED


async def test_an_mcp_tool_error_becomes_an_error_result(tools: dict[str, McpTool]) -> None:
    script = [calls(("s1", "stock", {"item": "kiwi"})), FINAL]
    outcome, events = await run(Agent("shop", ScriptedModel(script), [tools["stock"]]))
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = results_of(events)
    assert result.output is None
    assert result.error is not None
    assert result.error.error_class is ErrorClass.TOOL_FAILED
    assert "no item named 'kiwi'" in result.error.message


async def test_a_call_missing_a_required_argument_ends_invalid_decision(
    tools: dict[str, McpTool],
) -> None:
    script = [calls(("e1", "echo", {"times": 2}))]
    outcome, events = await run(
        Agent("echo", ScriptedModel(script), [tools["echo"]], max_invalid_proposals=0)
    )
    assert outcome.reason is TerminalReason.INVALID_DECISION
    assert "'text' is a required property" in (outcome.detail or "")
    assert results_of(events) == []


async def test_an_unreachable_server_is_a_tool_error_of_class_unavailable() -> None:
    gone = StdioServer(command="loop-actors-no-such-mcp-server")
    with pytest.raises(ToolError) as raised:
        await call_mcp_tool(gone, "echo", {"text": "hi"})
    assert raised.value.error_class is ErrorClass.UNAVAILABLE


# --------------------------------------------------------------------------- streamable HTTP


@pytest.fixture
def http_server() -> Iterator[HttpServer]:
    """The test server over streamable HTTP (asyncio, its own process, an OS-chosen port)."""
    process = subprocess.Popen(
        [sys.executable, str(SERVER_APP), "--http"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout=30)
        if not lines or not lines[0].startswith("PORT "):
            pytest.fail(f"the HTTP MCP server did not start: {lines!r}")
        port = int(lines[0].split()[1])
        yield HttpServer(url=f"http://127.0.0.1:{port}/mcp")
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


# The SDK's SSE reader leaves httpx2 byte streams unexhausted; under trio their garbage
# collection warns (harmless: the responses are closed). See the research notes on mcp.
UNEXHAUSTED_STREAMS = pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected before it had been exhausted:ResourceWarning"
)


@UNEXHAUSTED_STREAMS
async def test_tools_of_a_streamable_http_server_run_end_to_end(http_server: HttpServer) -> None:
    listed = await mcp_tools_async(http_server)
    assert {t.name: t.effect for t in listed} == {
        "stock": ToolEffect.READ,
        "echo": ToolEffect.WRITE,
        "set_label": ToolEffect.WRITE,
        "delete_item": ToolEffect.WRITE,
    }
    script = [calls(("s1", "stock", {"item": "pear"}), ("s2", "stock", {"item": "kiwi"})), FINAL]
    outcome, events = await run(Agent("shop", ScriptedModel(script), listed))
    assert outcome.reason is TerminalReason.COMPLETED
    ok, failed = results_of(events)
    assert ok.output == {"item": "pear", "count": 0}
    assert failed.error is not None
    assert "no item named 'kiwi'" in failed.error.message
    gc.collect()  # finalise the SDK's leftover streams while the filter applies


@UNEXHAUSTED_STREAMS
async def test_a_closed_http_port_is_a_tool_error_of_class_unavailable() -> None:
    with trio.fail_after(30):
        with pytest.raises(ToolError) as raised:
            await call_mcp_tool(HttpServer(url="http://127.0.0.1:9/mcp"), "echo", {"text": "x"})
    assert raised.value.error_class is ErrorClass.UNAVAILABLE
