"""Tools from an MCP server: ``mcp_tools(StdioServer(...))`` lists them as ``Tool`` objects.

Each MCP tool becomes one :class:`McpTool`: its name, description and input
schema are the server's; its effect comes from the tool's annotations
(``readOnlyHint`` true is a read, anything else a write). Arguments are checked
against the server's JSON Schema before a call is dispatched.

Sessions belong to a Runtime: inside ``async with Runtime()`` the first call to a
server opens one session (one subprocess for stdio, one HTTP session for
streamable HTTP) that every later call of that runtime shares, concurrent calls
included; the runtime closes it when it closes (:class:`McpSessions`). A session
that ends (the server exited, the connection broke) is replaced at the next call.
Outside a runtime (``call_mcp_tool`` called directly) each call opens a session
of its own.

The ``mcp`` package is an optional extra (``pip install 'loop-actors[mcp]'``);
it is imported only when an MCP server is contacted.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

import trio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator
from pydantic.dataclasses import dataclass
from pydantic_core import InitErrorDetails, PydanticCustomError

from aggregates.decisions import ErrorClass, ToolEffect
from loop_actors._errors import ToolDefinitionError, ToolError, UsageError
from loop_actors._logs import package_logger
from loop_actors.agent.tools import Reconciled, Tool, ToolContext, ToolOptions, schema_digest

if TYPE_CHECKING:
    import mcp.types
    from anyio.streams.memory import MemoryObjectReceiveStream
    from mcp import ClientSession

log = package_logger(__name__)

DEFAULT_MCP_TIMEOUT_S = 30.0

CLOSE_BOUND_S = 10.0
"""How long closing a runtime's MCP sessions may take before they are abandoned.

The SDK's own shutdown of a stdio server is bounded too (close stdin, 2 s, SIGTERM,
SIGKILL); this bound covers all of a runtime's sessions closing together.
"""

StderrOption = Literal["inherit", "discard"] | Path


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class StdioServer:
    """An MCP server started as a subprocess and spoken to over its stdin and stdout.

    One process is started for the listing, and one per runtime for the calls (it
    is started again if it exits).
    """

    command: str
    """The executable (looked up on ``PATH``)."""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    """Extra environment variables, merged over the SDK's safe default environment."""
    cwd: str | None = None
    stderr: StderrOption = "discard"
    """Where the server's stderr goes: ``"discard"`` (the default: servers print
    banners and logs there), ``"inherit"`` (this process's stderr, the terminal), or
    a file path, appended to (created if missing)."""

    @field_validator("stderr", mode="before")
    @classmethod
    def _stderr_is_a_choice_or_a_path(cls, value: object) -> object:
        if isinstance(value, str) and value not in ("inherit", "discard"):
            if not value.strip():
                raise ValueError('give "inherit", "discard" or a file path')
            return Path(value)
        return value


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


def _import_mcp() -> None:
    """Check that the optional ``mcp`` package is there.

    Raises:
        UsageError: the ``mcp`` package is not installed.
    """
    try:
        import mcp  # noqa: F401, PLC0415
    except ImportError as error:  # an optional extra
        raise UsageError(
            "MCP tools need the mcp package: pip install 'loop-actors[mcp]'"
        ) from error


@contextmanager
def _stderr_file(server: StdioServer) -> Iterator[TextIO]:
    """The file a stdio server's stderr is written to, closed on exit.

    Raises:
        OSError: the log file cannot be opened (the message names it).
    """
    if server.stderr == "inherit":
        yield sys.stderr
        return
    target = os.devnull if server.stderr == "discard" else server.stderr
    try:
        file = open(target, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as error:
        raise OSError(f"cannot open {target} for the server's stderr: {error}") from error
    with file:
        yield file


@asynccontextmanager
async def _session(
    server: McpServer, *, on_end: Callable[[], None] | None = None
) -> AsyncIterator[ClientSession]:
    """An initialised client session to the server, closed on exit.

    ``on_end`` is called when the server's side of the connection ends by itself
    (a stdio server exited, an HTTP stream closed): the session can send nothing more.

    Raises:
        UsageError: the ``mcp`` package is not installed.
    """
    _import_mcp()
    from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: PLC0415
    from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415

    async with AsyncExitStack() as stack:
        if isinstance(server, StdioServer):
            parameters = StdioServerParameters(
                command=server.command, args=list(server.args), env=server.env, cwd=server.cwd
            )
            errlog = stack.enter_context(_stderr_file(server))
            read, write = await stack.enter_async_context(stdio_client(parameters, errlog))
        else:
            import httpx2  # noqa: PLC0415 - a dependency of mcp

            client = await stack.enter_async_context(
                httpx2.AsyncClient(headers=server.headers, timeout=httpx2.Timeout(30.0, read=300.0))
            )
            read, write = await stack.enter_async_context(
                streamable_http_client(server.url, http_client=client)
            )
        watched = await stack.enter_async_context(_watch_end(read, on_end))
        session = await stack.enter_async_context(ClientSession(watched, write))
        await session.initialize()
        yield session


@asynccontextmanager
async def _watch_end(
    read: Any, on_end: Callable[[], None] | None
) -> AsyncIterator[MemoryObjectReceiveStream[Any]]:
    """The read stream (an SDK ``ReadStream``), relayed; ``on_end`` is called when it ends.

    The SDK fails the calls in flight when the stream ends; this tells the owner
    of the session as well, so that the next call opens a new one instead of
    being sent into a dead connection.
    """
    import anyio  # noqa: PLC0415 - a dependency of mcp

    relay_in, relay_out = anyio.create_memory_object_stream[Any](0)

    async def relay() -> None:
        async with read, relay_in:
            try:
                async for item in read:
                    await relay_in.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the session closed its end: it is being closed
        if on_end is not None:
            on_end()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay)
        try:
            yield relay_out
        finally:
            relay_out.close()
            nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- sessions


class _Connection:
    """One session to one server, held open by a task of :class:`McpSessions`."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.session: ClientSession | None = None
        self.usable = True
        """False once it ended or was retired: new calls open another session."""
        self.in_flight = 0
        self.closing = False
        self.stop = trio.Event()
        """Set to close the session (when no call uses it any more)."""
        self.stopped = trio.Event()

    def ended(self) -> None:
        """The server's side ended (it exited): calls in flight fail, new calls reconnect."""
        self.usable = False
        if not self.closing:
            log.warning(
                "MCP server %s ended its session (it exited?); the next call starts a new one",
                _describe(self.server),
            )
        self.stop.set()

    def retire(self) -> None:
        """No new calls; close it once the calls in flight are done."""
        self.usable = False
        if self.in_flight == 0:
            self.stop.set()


class McpSessions:
    """The MCP sessions of one runtime: one per server, opened by its first call.

    The Runtime opens one with :func:`open_mcp_sessions` and makes it current for
    its runs; :func:`call_mcp_tool` uses the current one. Rules:

    - the first call to a server opens its session (a stdio server's process);
      concurrent first calls wait for that one session;
    - calls share it, concurrently (MCP requests carry ids);
    - when the server's side ends (the process exited or was killed), calls in
      flight fail with class ``unavailable`` (for a write: outcome unknown) and
      the next call opens a new session;
    - a call that fails with anything but a tool result (a transport or protocol
      error, e.g. an HTTP server that forgot the session) retires the session: it
      closes once its other calls are done, and the next call opens a new one;
    - closing stops every session (a stdio server gets its stdin closed, then
      SIGTERM, then SIGKILL, and is reaped) within :data:`CLOSE_BOUND_S`.
    """

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._connections: dict[str, _Connection] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._closed = False

    async def call_tool(
        self, server: McpServer, name: str, arguments: dict[str, Any]
    ) -> mcp.types.CallToolResult:
        """Call a tool through the server's session, opening it if need be.

        Raises:
            Exception: whatever opening the session or the call raised (the SDK's own
                exceptions), for :func:`call_mcp_tool` to classify.

        Cancellation: a checkpoint; a call cancelled in flight leaves the session open.
        """
        connection = await self._connect(server)
        assert connection.session is not None
        connection.in_flight += 1
        try:
            return await connection.session.call_tool(name, arguments)
        except Exception:
            # A transport or protocol failure: the session may be broken or forgotten.
            connection.retire()
            raise
        finally:
            connection.in_flight -= 1
            if not connection.usable and connection.in_flight == 0:
                connection.stop.set()

    async def _connect(self, server: McpServer) -> _Connection:
        key = _server_key(server)
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock:
            if self._closed:
                raise RuntimeError("the runtime's MCP sessions are closed")
            current = self._connections.get(key)
            if current is not None and current.usable:
                return current
            connection = _Connection(server)
            await self._nursery.start(self._hold, connection)
            if self._closed:  # closed while this one was opening
                connection.stop.set()
                raise RuntimeError("the runtime's MCP sessions are closed")
            self._connections[key] = connection
            return connection

    async def _hold(self, connection: _Connection, *, task_status: trio.TaskStatus[None]) -> None:
        """Open the session, then keep it until it is stopped or ends by itself."""
        started = False
        try:
            async with _session(connection.server, on_end=connection.ended) as session:
                connection.session = session
                task_status.started()
                started = True
                await connection.stop.wait()
                connection.closing = True
        except Exception:
            if not started:
                raise  # the caller of the first call gets it
            # After the session ended: its close failed. The process is abandoned
            # (the SDK kills what it can); nothing is left to answer.
            log.warning(
                "closing the session to MCP server %s failed",
                _describe(connection.server),
                exc_info=True,
            )
        finally:
            connection.usable = False
            connection.stopped.set()

    async def aclose(self) -> None:
        """Close every session, within :data:`CLOSE_BOUND_S`.

        Cancellation: shielded; whatever did not close within the bound is abandoned
        (and logged).
        """
        self._closed = True
        connections = list(self._connections.values())
        self._connections.clear()
        for connection in connections:
            connection.closing = True
            connection.stop.set()
        with trio.move_on_after(CLOSE_BOUND_S, shield=True) as bound:
            for connection in connections:
                await connection.stopped.wait()
        if bound.cancelled_caught:
            log.warning("MCP sessions did not close within %g s; abandoning them", CLOSE_BOUND_S)
            self._nursery.cancel_scope.cancel()


def _server_key(server: McpServer) -> str:
    """Servers that are equal share a session."""
    return json.dumps([type(server).__name__, asdict(server)], sort_keys=True, default=str)


_current: ContextVar[McpSessions | None] = ContextVar("loop_actors_mcp_sessions", default=None)


@asynccontextmanager
async def open_mcp_sessions() -> AsyncIterator[McpSessions]:
    """A pool of MCP sessions, every one closed on exit (see :class:`McpSessions`).

    Cancellation: the close on exit is shielded and bounded by :data:`CLOSE_BOUND_S`.
    """
    async with trio.open_nursery() as nursery:
        sessions = McpSessions(nursery)
        try:
            yield sessions
        finally:
            await sessions.aclose()


@contextmanager
def using_mcp_sessions(sessions: McpSessions) -> Iterator[None]:
    """Make ``sessions`` the ones that MCP tool calls of this task (and its children) use."""
    token = _current.set(sessions)
    try:
        yield
    finally:
        _current.reset(token)


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
    """A tool of an MCP server, called through its runtime's session to the server.

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

        options = ToolOptions(
            name=name,
            description=definition.description or definition.title or definition.name,
            effect=effect,
            timeout_s=timeout_s,
            reconcile=reconcile,
        )
        super().__init__(call, options=options)
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

        Cancellation: a checkpoint; the runtime's session stays open (a session of
        its own, outside a runtime, is closed).
        """
        try:
            validated = self.validate(arguments)
            return await self.fn(validated.model_dump(mode="json"))
        finally:
            if running is not None:
                running.set()


async def call_mcp_tool(server: McpServer, name: str, arguments: dict[str, Any]) -> Any:
    """Call one MCP tool: through the runtime's session to the server, else a session of its own.

    Inside a run of a Runtime, the call goes through the runtime's session to
    ``server`` (opened if need be; see :class:`McpSessions`). Called on its own, it
    opens a session for this one call and closes it.

    Cancellation: a checkpoint; ``trio.Cancelled`` passes through, and a session of
    its own is closed. For a write the outcome is then unknown to the caller.

    Returns:
        The result's ``structuredContent`` if it has one, else its text content
        (the text blocks joined with newlines).

    Raises:
        ToolError: the server answered with ``isError`` (class ``tool_failed``,
            with the server's text), or could not be reached, exited or failed to
            answer (class ``unavailable``: for a write, the outcome is then unknown).
        UsageError: the ``mcp`` package is not installed.
    """
    _import_mcp()
    import mcp.types  # noqa: PLC0415 - an optional extra

    sessions = _current.get()
    try:
        if sessions is not None:
            result = await sessions.call_tool(server, name, arguments)
        else:
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
    "McpSessions",
    "McpTool",
    "StdioServer",
    "call_mcp_tool",
    "mcp_tools",
    "mcp_tools_async",
    "open_mcp_sessions",
    "using_mcp_sessions",
]
