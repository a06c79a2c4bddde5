"""Tools from an MCP server: ``mcp_tools(StdioServer(...))`` lists them as ``Tool`` objects.

Each MCP tool becomes one :class:`McpTool`: its name, description and input
schema are the server's; its effect comes from the tool's annotations
(``readOnlyHint`` true is a read, anything else a write). Arguments are checked
against the server's JSON Schema before a call is dispatched. Every call opens
its own session (one subprocess for stdio, one HTTP session for streamable
HTTP), so a call survives a restart of the server and of this process alike.

The ``mcp`` package is an optional extra (``pip install 'loop-actors[mcp]'``);
it is imported only when an MCP server is contacted.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.dataclasses import dataclass
from pydantic_core import InitErrorDetails, PydanticCustomError

from aggregates.decisions import ErrorClass, ToolEffect
from loop_actors._errors import ToolDefinitionError, ToolError, UsageError
from loop_actors._tools import Reconciled, Tool, ToolContext, schema_digest

if TYPE_CHECKING:
    import mcp.types
    from mcp import ClientSession

DEFAULT_MCP_TIMEOUT_S = 30.0


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class StdioServer:
    """An MCP server started as a subprocess and spoken to over its stdin and stdout.

    A new process is started for the listing and for every call.
    """

    command: str
    """The executable (looked up on ``PATH``)."""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    """Extra environment variables, merged over the SDK's safe default environment."""
    cwd: str | None = None


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class HttpServer:
    """An MCP server reached over streamable HTTP (the endpoint URL, e.g. ``.../mcp``)."""

    url: str
    headers: dict[str, str] | None = None
    """Sent with every request (e.g. ``{"Authorization": "Bearer ..."}``)."""


McpServer = StdioServer | HttpServer


def _describe(server: McpServer) -> str:
    if isinstance(server, StdioServer):
        return " ".join([server.command, *server.args])
    return server.url


def _problem(error: BaseException) -> str:
    """An exception as ``Type: message``, with exception groups reduced to their leaves."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_problem(inner) for inner in error.exceptions)
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@asynccontextmanager
async def _session(server: McpServer) -> AsyncIterator[ClientSession]:
    """An initialised client session to the server, closed on exit.

    Raises:
        UsageError: the ``mcp`` package is not installed.
    """
    try:
        from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: PLC0415
        from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415
    except ImportError as error:  # an optional extra
        raise UsageError(
            "MCP tools need the mcp package: pip install 'loop-actors[mcp]'"
        ) from error

    if isinstance(server, StdioServer):
        parameters = StdioServerParameters(
            command=server.command, args=list(server.args), env=server.env, cwd=server.cwd
        )
        async with (
            stdio_client(parameters) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session
    else:
        import httpx2  # noqa: PLC0415 - a dependency of mcp

        client = httpx2.AsyncClient(
            headers=server.headers, timeout=httpx2.Timeout(30.0, read=300.0)
        )
        async with (
            client,
            streamable_http_client(server.url, http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


# --------------------------------------------------------------------------- arguments


def _check_schema(name: str, schema: dict[str, Any]) -> Any:
    """A JSON Schema validator for a tool's input schema.

    Raises:
        ToolDefinitionError: the schema is not a valid JSON Schema.
    """
    # A dependency of mcp; imported by name so that its type stubs are not needed.
    jsonschema: Any = importlib.import_module("jsonschema")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as error:
        raise ToolDefinitionError(
            f"MCP tool {name}: invalid input schema: {error.message}"
        ) from None
    return cls(schema)


def _tool_name(mcp_name: str) -> str:
    """The name the model uses: the MCP name, with characters an identifier cannot hold as ``_``."""
    name = re.sub(r"\W", "_", mcp_name)
    if not name or name[0].isdigit():
        name = f"_{name}"
    return name


def _not_found(effect_key: str) -> Reconciled:
    """An idempotent call can safely be sent again: report it "not found" so it is."""
    return Reconciled(status="not_found")


# --------------------------------------------------------------------------- the tool


class McpTool(Tool):
    """A tool of an MCP server, called through a fresh session each time.

    ``schema`` is the server's ``inputSchema``, unchanged. ``validate`` checks
    arguments against it with ``jsonschema`` (JSON types are strict: ``"3"`` is
    not an integer) and returns them unchanged, as a pydantic model that allows
    any field; they are sent to the server as given.
    """

    def __init__(self, server: McpServer, definition: mcp.types.Tool, *, timeout_s: float) -> None:
        """Describe one MCP tool of ``server`` (see :func:`mcp_tools`).

        Raises:
            ToolDefinitionError: the tool's input schema is not a valid JSON Schema.
        """
        self.server = server
        self.mcp_name = definition.name
        name = _tool_name(definition.name)
        annotations = definition.annotations
        read_only = annotations is not None and annotations.read_only_hint is True
        idempotent = annotations is not None and annotations.idempotent_hint is True
        destructive = annotations is not None and annotations.destructive_hint is True
        effect = ToolEffect.READ if read_only else ToolEffect.WRITE
        reconcile = (
            _not_found if effect is ToolEffect.WRITE and idempotent and not destructive else None
        )

        async def call(arguments: dict[str, Any]) -> Any:
            return await call_mcp_tool(server, definition.name, arguments)

        super().__init__(
            call,
            name=name,
            description=definition.description or definition.title or definition.name,
            effect=effect,
            timeout_s=timeout_s,
            reconcile=reconcile,
        )
        schema = dict(definition.input_schema)
        self._validator = _check_schema(name, schema)
        self.arguments_model = create_model(
            f"{name}_arguments", __config__=ConfigDict(extra="allow")
        )
        self._fields = ()
        self.context_parameter = None
        self.schema = schema
        self.schema_digest = schema_digest(name, self.effect, schema)

    def __repr__(self) -> str:
        server = _describe(self.server)
        return f"McpTool({self.name!r}, effect={self.effect.value!r}, server={server!r})"

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        """Check the arguments against the MCP tool's input schema.

        Raises:
            pydantic.ValidationError: one line per problem, located by its path.
        """
        problems = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        if problems:
            raise ValidationError.from_exception_data(
                f"{self.name}_arguments",
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "json_schema", "{problem}", {"problem": p.message}
                        ),
                        loc=tuple(p.absolute_path),
                        input=p.instance,
                    )
                    for p in problems
                ],
            )
        return self.arguments_model.model_validate(arguments)

    async def invoke(
        self,
        arguments: dict[str, Any],
        context: ToolContext | None = None,
        *,
        running: threading.Event | None = None,
    ) -> Any:
        """Validate the arguments and call the tool on the server (see :func:`call_mcp_tool`).

        ``running`` is set when the call has stopped (it never outlives this await).

        Cancellation: a checkpoint; the session (and a stdio server process) is closed.
        """
        try:
            validated = self.validate(arguments)
            return await self.fn(validated.model_dump(mode="json"))
        finally:
            if running is not None:
                running.set()


async def call_mcp_tool(server: McpServer, name: str, arguments: dict[str, Any]) -> Any:
    """Call one MCP tool in a session of its own.

    Cancellation: a checkpoint; the session is closed and ``trio.Cancelled`` passes
    through. For a write the outcome is then unknown to the caller.

    Returns:
        The result's ``structuredContent`` if it has one, else its text content
        (the text blocks joined with newlines).

    Raises:
        ToolError: the server answered with ``isError`` (class ``tool_failed``,
            with the server's text), or could not be reached or failed to answer
            (class ``unavailable``: for a write, the outcome is then unknown).
    """
    import mcp.types  # noqa: PLC0415 - an optional extra

    try:
        async with _session(server) as session:
            result = await session.call_tool(name, arguments)
    except UsageError:
        raise
    except Exception as error:  # transport, protocol and server failures alike
        raise ToolError(
            f"MCP server {_describe(server)} failed: {_problem(error)}",
            error_class=ErrorClass.UNAVAILABLE,
        ) from error
    if not isinstance(result, mcp.types.CallToolResult):
        raise ToolError(
            f"MCP tool {name} answered a {type(result).__name__}, not a tool result",
            error_class=ErrorClass.UNAVAILABLE,
        )
    text = "\n".join(
        block.text for block in result.content if isinstance(block, mcp.types.TextContent)
    )
    if result.is_error:
        raise ToolError(text or f"MCP tool {name} failed")
    if result.structured_content is not None:
        return result.structured_content
    return text


# --------------------------------------------------------------------------- listing


async def mcp_tools_async(
    server: McpServer,
    *,
    include: list[str] | None = None,
    timeout_s: float = DEFAULT_MCP_TIMEOUT_S,
) -> list[Tool]:
    """List an MCP server's tools as ``Tool`` objects (see :func:`mcp_tools`).

    Cancellation: a checkpoint; the session is closed.
    """
    if not isinstance(server, StdioServer | HttpServer):
        raise UsageError(f"expected a StdioServer or an HttpServer, got {server!r}")
    if isinstance(include, str):
        raise UsageError("give include as a list of tool names")
    definitions: list[mcp.types.Tool] = []
    try:
        with trio.fail_after(timeout_s):
            async with _session(server) as session:
                cursor: str | None = None
                while True:
                    page = await session.list_tools(params=_page(cursor))
                    definitions.extend(page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
    except UsageError:
        raise
    except trio.TooSlowError:
        raise ToolDefinitionError(
            f"cannot list the tools of MCP server {_describe(server)}: "
            f"no answer within {timeout_s:g} s"
        ) from None
    except Exception as error:
        raise ToolDefinitionError(
            f"cannot list the tools of MCP server {_describe(server)}: {_problem(error)}"
        ) from error
    if include is not None:
        listed = {definition.name for definition in definitions}
        missing = [name for name in include if name not in listed]
        if missing:
            raise ToolDefinitionError(
                f"MCP server {_describe(server)} has no tool named {', '.join(missing)}"
                f" (it has {', '.join(sorted(listed)) or 'none'})"
            )
        definitions = [definition for definition in definitions if definition.name in include]
    return [McpTool(server, definition, timeout_s=timeout_s) for definition in definitions]


def _page(cursor: str | None) -> mcp.types.PaginatedRequestParams | None:
    if cursor is None:
        return None
    import mcp.types  # noqa: PLC0415 - an optional extra

    return mcp.types.PaginatedRequestParams(cursor=cursor)


def mcp_tools(
    server: McpServer,
    *,
    include: list[str] | None = None,
    timeout_s: float = DEFAULT_MCP_TIMEOUT_S,
) -> list[Tool]:
    """List an MCP server's tools as ``Tool`` objects, for ``Agent(tools=...)``.

    Synchronous, so that an agent can be built at import time; it opens one short
    session to the server. Inside a running trio program, use
    ``await mcp_tools_async(...)`` instead.

    Args:
        server: a :class:`StdioServer` or an :class:`HttpServer`.
        include: the MCP tool names to keep (default: all of them).
        timeout_s: the limit for the listing, and each tool's per-call timeout.

    Returns:
        One :class:`McpTool` per MCP tool, in the server's order. Effect:
        ``readOnlyHint`` true is a read; anything else is a write (an
        unannotated tool is a write, the safe default). A write marked
        ``idempotentHint`` and not ``destructiveHint`` may be sent again when its
        outcome is unknown (its ``reconcile`` answers "not found"); any other
        write with an unknown outcome pauses the invocation for a person.

    Raises:
        ToolDefinitionError: the server could not be started or reached, did not
            answer in time, lacks a tool named in ``include``, or has a tool whose
            input schema is invalid.
        UsageError: called inside a running trio event loop, or ``mcp`` is not installed.
    """
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        pass
    else:
        raise UsageError(
            "mcp_tools() cannot run inside a running trio event loop: "
            "use `await mcp_tools_async(...)` there"
        )
    return trio.run(lambda: mcp_tools_async(server, include=include, timeout_s=timeout_s))


__all__ = [
    "HttpServer",
    "McpServer",
    "McpTool",
    "StdioServer",
    "call_mcp_tool",
    "mcp_tools",
    "mcp_tools_async",
]
