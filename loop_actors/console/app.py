"""The console's ASGI app, and serving it in-process with hypercorn's trio worker."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import trio
from starlette.applications import Starlette

from loop_actors.agent.agent import Agent
from loop_actors.console.api import api_routes
from loop_actors.console.bulk import ConsoleRuns
from loop_actors.console.guard import ASGIApp, ConsoleGuard
from loop_actors.console.pages import page_routes
from loop_actors.console.reads import ConsoleReads
from loop_actors.console.settings import ConsoleSettings
from loop_actors.runtime.runtime import Runtime

logger = logging.getLogger(__name__)


def create_app(
    runtime: Runtime, settings: ConsoleSettings, *, runs: ConsoleRuns | None = None
) -> ASGIApp:
    """The console over an open ``runtime`` (opened with ``follow_projections=True``), guarded.

    ``runs``: the agents it resumes and reconciles for bulk actions, whose
    :meth:`ConsoleRuns.serve` the caller runs meanwhile; None: it serves no agent
    (bulk resume and reconcile are refused, ``409 no_agent``).
    """
    reads = ConsoleReads(runtime)
    runs = runs if runs is not None else ConsoleRuns(runtime)
    routes = [*api_routes(runtime, reads, runs), *page_routes(reads, settings.token)]
    return ConsoleGuard(Starlette(routes=routes), settings)


async def serve_console(
    settings: ConsoleSettings,
    *,
    agents: Sequence[Agent] = (),
    ready: Callable[[list[str]], None] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open a runtime on the settings' database and serve the console until cancelled.

    ``agents``: those it resumes and reconciles for bulk actions (``serve --agent``),
    in this process. ``ready`` (and ``task_status.started``) get the addresses it
    listens on, once it does (``http://127.0.0.1:PORT``; with port 0, the port the
    system chose).

    Raises:
        UsageError: two agents of one name.
        StoreUnavailableError: the database cannot be opened.
        OSError: the address cannot be bound (in use, not this machine's).

    Cancellation: stops serving (open streams are closed); the runs it drives stop
    at their next commit, or are abandoned after a second (none is recorded
    ``cancelled``: a worker or a resume continues each); closes the runtime.
    """
    from hypercorn.config import Config  # noqa: PLC0415 - the console extra, when serving
    from hypercorn.trio import serve  # noqa: PLC0415

    config = Config()
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    config.bind = [f"{host}:{settings.port}"]
    config.accesslog = None
    config.errorlog = logger
    config.graceful_timeout = 1.0
    runtime = Runtime(settings.db_url, follow_projections=True)
    runs = ConsoleRuns(runtime, agents)  # its agents are checked before anything is opened
    async with runtime:
        app = create_app(runtime, settings, runs=runs)

        async def run(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
            await serve(app, config, task_status=task_status)  # type: ignore[arg-type]

        async with trio.open_nursery() as nursery:
            await nursery.start(runs.serve)
            bound: list[str] = await nursery.start(run)
            if ready is not None:
                ready(bound)
            task_status.started(bound)


__all__ = ["create_app", "serve_console"]
