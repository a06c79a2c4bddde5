"""A small MCP server for the tests, written with the mcp package.

Run over stdio (the default): ``python tests/support/mcp_server_app.py``.
Run over streamable HTTP on 127.0.0.1 with a port the OS chooses:
``python tests/support/mcp_server_app.py --http``; it prints ``PORT <n>`` once it listens.

With ``MCP_TEST_PID_FILE`` set, the server appends its pid to that file when it
starts (the tests count server processes with it). With ``MCP_TEST_BANNER`` set, it
writes that line to its stderr when it starts, as many real servers do.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("loop-actors-test", log_level="WARNING")

INVENTORY = {"apple": 3, "pear": 0}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def stock(item: str) -> dict[str, Any]:
    """How many of an item are in stock."""
    if item not in INVENTORY:
        raise ToolError(f"no item named {item!r}")
    return {"item": item, "count": INVENTORY[item]}


@server.tool(structured_output=False)
def echo(text: str, times: int = 1) -> str:
    """Say the text back (unannotated: a write, as far as the client knows)."""
    return " ".join([text] * times)


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
def set_label(item: str, label: str) -> str:
    """Set an item's label (idempotent: setting it twice changes nothing more)."""
    return f"{item} is labelled {label}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True))
def delete_item(item: str) -> str:
    """Delete an item (idempotent but destructive)."""
    return f"deleted {item}"


@server.tool()
def nap(seconds: float, started_file: str = "") -> str:
    """Sleep, having first written ``started_file`` (a write: the client cannot know)."""
    if started_file:
        with open(started_file, "w") as file:
            file.write(str(os.getpid()))
    time.sleep(seconds)
    return f"slept {seconds:g} s"


def announce() -> None:
    """Record this process's pid and print the banner, as the environment asks."""
    pid_file = os.environ.get("MCP_TEST_PID_FILE")
    if pid_file:
        with open(pid_file, "a") as file:
            file.write(f"{os.getpid()}\n")
    banner = os.environ.get("MCP_TEST_BANNER")
    if banner:
        print(banner, file=sys.stderr, flush=True)


def serve_http() -> None:
    """Serve streamable HTTP with asyncio on an OS-chosen port, printed before serving."""
    import anyio
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(f"PORT {port}", flush=True)

    async def main() -> None:
        await uvicorn.Server(config).serve(sockets=[sock])

    anyio.run(main)


if __name__ == "__main__":
    announce()
    if "--http" in sys.argv[1:]:
        serve_http()
    else:
        server.run()
