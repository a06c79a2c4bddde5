"""Tools from an MCP server. To stay in one file, this file is also the server."""

import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, StdioServer, mcp_tools

# --------------------------------------------------------------------------- the MCP server

inventory = MCPServer("inventory", log_level="WARNING")
STOCK = {"apple": 3, "pear": 0}


@inventory.tool(annotations=ToolAnnotations(read_only_hint=True))
def stock(item: str) -> dict[str, Any]:
    """How many of an item are in stock."""
    if item not in STOCK:
        raise ToolError(f"no item named {item!r}")
    return {"item": item, "count": STOCK[item]}


@inventory.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
def set_label(item: str, label: str) -> str:
    """Set the shelf label of an item (setting it twice changes nothing more)."""
    return f"{item} labelled {label!r}"


@inventory.tool(structured_output=False)
def order(item: str, quantity: int) -> str:
    """Order more of an item from the supplier."""
    return f"ordered {quantity} {item}"


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    inventory.run()  # over stdio: the agent below starts this file with "serve"
    sys.exit()

# --------------------------------------------------------------------------- the agent

SERVER = StdioServer(command=sys.executable, args=[str(Path(__file__).resolve()), "serve"])

# One short session lists the server's tools when this module is imported.
tools = mcp_tools(SERVER, timeout_s=20)


def clerk(request: ModelRequest) -> dict[str, object]:
    if request.step == 1:  # two reads: they run concurrently
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "s1", "name": "stock", "arguments": {"item": "pear"}},
                {"id": "s2", "name": "stock", "arguments": {"item": "kiwi"}},
            ],
        }
    if request.step == 2:  # two writes: one after the other
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "o1", "name": "order", "arguments": {"item": "pear", "quantity": 5}},
                {"id": "l1", "name": "set_label", "arguments": {"item": "pear", "label": "soon"}},
            ],
        }
    lines = [
        f"{r.call_id}: {r.output}" if r.error is None else f"{r.call_id}: {r.error.message}"
        for r in request.results
    ]
    return {"kind": "final", "answer": "; ".join(lines)}


agent = Agent("clerk", ScriptedModel(clerk), tools=tools)

# A call that breaks the MCP tool's input schema is refused before anything runs; with
# max_invalid_proposals=0 the first refusal ends the run (by default the model is told
# the problems and asked again, twice).
bad_call = {
    "kind": "tool_calls",
    "calls": [{"id": "o2", "name": "order", "arguments": {"item": "pear"}}],
}
careless = Agent("careless-clerk", ScriptedModel([bad_call]), tools=tools, max_invalid_proposals=0)


def main() -> None:
    for tool_ in tools:
        reconciled = "re-sent if unknown" if tool_.reconcile else "-"
        print(f"{tool_.name}: {tool_.effect.value} {reconciled}")

    runtime = Runtime()
    outcome = runtime.run_sync(agent, "Restock the pears.")
    print(outcome.reason, "-", outcome.answer)

    outcome = runtime.run_sync(careless, "Order pears.")
    print(outcome.reason, "-", outcome.detail)


if __name__ == "__main__":
    main()
