"""``serve`` (the operator console) and ``watch`` (follow an invocation in the terminal)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

import trio

from loop_actors._errors import UsageError
from loop_actors.cli.agents import load_agent
from loop_actors.cli.common import trio_run
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.history import record_line
from loop_actors.cli.reading import open_for_reading
from loop_actors.store.history_records import history_records
from loop_actors.store.store import EventStore
from loop_actors.store.url import resolve_db_url

EXTRA = "pip install 'loop-actors[console]'"


def run(args: argparse.Namespace) -> int:
    """``serve`` or ``watch``."""
    if args.command == "watch":
        return _watch(args)
    try:
        from loop_actors.console import ConsoleSettings, serve_console  # noqa: PLC0415 - the extra
    except ImportError as error:
        raise UsageError(f"serve needs the console extra ({EXTRA}): {error}") from None
    settings = ConsoleSettings.resolve(
        db_url=args.db,
        host=args.host,
        port=args.port,
        token=args.token,
        forwarded_allow_ips=args.forwarded_allow_ips,
    )
    agents = [load_agent(reference) for reference in args.agents]  # before the database
    # The store must exist: a mistyped path would show an empty console (and create it).
    EventStore(resolve_db_url(args.db), create=False).close()

    def ready(bound: list[str]) -> None:
        for address in bound:
            print(f"loop-actors console on {address}/", flush=True)
        if settings.token_generated:
            print(f"token (decisions need it): {settings.token}", flush=True)
        else:
            print("token: the one given (--token or $LOOP_ACTORS_CONSOLE_TOKEN)", flush=True)
        if agents:
            names = ", ".join(agent.name for agent in agents)
            print(f"agents (bulk resume and reconcile run here): {names}", flush=True)

    async def serve() -> int:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_sigterm, nursery.cancel_scope)
            try:
                await serve_console(settings, agents=agents, ready=ready)
                nursery.cancel_scope.cancel()  # it returned: stop the signal watcher too
            except OSError as error:
                raise UsageError(
                    f"cannot listen on {settings.host}:{settings.port}: {error}"
                ) from None
        return ExitCode.OK

    return trio_run(serve)


async def _stop_on_sigterm(scope: trio.CancelScope) -> None:
    """SIGTERM (a service manager, a container) stops the console: streams closed, exit 0."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            print("loop-actors: SIGTERM: the console stops", file=sys.stderr, flush=True)
            scope.cancel()
            return


def _watch(args: argparse.Namespace) -> int:
    if args.after < 0:
        raise UsageError(f"--from must be at least 0, got {args.after}")
    from loop_actors.console.follow import follow_history  # noqa: PLC0415 - needs no extra

    store = open_for_reading(args.db)

    async def read_after(after: int) -> list[dict[str, Any]]:
        return await trio.to_thread.run_sync(_records, store, args.invocation_id, after)

    async def watch() -> int:
        async for record in follow_history(read_after, after=args.after):
            line = json.dumps(record, ensure_ascii=False) if args.json else record_line(record)
            print(line, flush=True)
        return ExitCode.OK

    try:
        return trio_run(watch)
    finally:
        store.close()


def _records(store: EventStore, invocation_id: str, after: int) -> list[dict[str, Any]]:
    return history_records(store, invocation_id, after=after)


__all__ = ["run"]
