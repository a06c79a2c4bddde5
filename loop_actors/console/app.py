"""The console's ASGI app, and serving it in-process with hypercorn's trio worker."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from starlette.applications import Starlette

from loop_actors.console.api import api_routes
from loop_actors.console.guard import ASGIApp, ConsoleGuard
from loop_actors.console.pages import page_routes
from loop_actors.console.reads import ConsoleReads
from loop_actors.console.settings import ConsoleSettings
from loop_actors.runtime.runtime import Runtime

logger = logging.getLogger(__name__)


def create_app(runtime: Runtime, settings: ConsoleSettings) -> ASGIApp:
    """The console over an open ``runtime`` (opened with ``follow_projections=True``), guarded."""
    reads = ConsoleReads(runtime)
    app = Starlette(routes=[*api_routes(runtime, reads), *page_routes(reads, settings.token)])
    return ConsoleGuard(app, settings)


async def serve_console(
    settings: ConsoleSettings,
    *,
    ready: Callable[[list[str]], None] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open a runtime on the settings' database and serve the console until cancelled.

    ``ready`` (and ``task_status.started``) get the addresses it listens on, once it
    does (``http://127.0.0.1:PORT``; with port 0, the port the system chose).

    Raises:
        StoreUnavailableError: the database cannot be opened.
        OSError: the address cannot be bound (in use, not this machine's).

    Cancellation: stops serving (open streams are closed) and closes the runtime.
    """
    from hypercorn.config import Config  # noqa: PLC0415 - the console extra, when serving
    from hypercorn.trio import serve  # noqa: PLC0415

    config = Config()
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    config.bind = [f"{host}:{settings.port}"]
    config.accesslog = None
    config.errorlog = logger
    config.graceful_timeout = 1.0
    async with Runtime(settings.db_url, follow_projections=True) as runtime:
        app = create_app(runtime, settings)

        async def run(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
            await serve(app, config, task_status=task_status)  # type: ignore[arg-type]

        async with trio.open_nursery() as nursery:
            bound: list[str] = await nursery.start(run)
            if ready is not None:
                ready(bound)
            task_status.started(bound)


__all__ = ["create_app", "serve_console"]
