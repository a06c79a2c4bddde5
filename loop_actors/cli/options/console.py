"""The options of ``serve`` and ``watch`` (the console)."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, db_option

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
"""``loop_actors.console.settings``'s defaults (a test checks that they agree)."""


def port(text: str) -> int:
    """An argparse type: a TCP port, 0..65535 (0: one the system chooses)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def _add_serve(serve: argparse.ArgumentParser) -> None:
    db_option(serve)
    serve.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"the address to listen on (default {DEFAULT_HOST}: this machine only; beyond "
        "loopback a token is required and every request needs it)",
    )
    serve.add_argument(
        "--port", type=port, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: any free one"
    )
    serve.add_argument(
        "--token",
        help="the token decisions (and, beyond loopback, every request) need "
        "(default $LOOP_ACTORS_CONSOLE_TOKEN, else one is generated and printed)",
    )
    serve.add_argument(
        "--agent",
        metavar="MODULE:ATTR",
        action="append",
        default=[],
        dest="agents",
        help="an agent the console resumes and reconciles for its bulk actions, in this "
        "process (repeat it for each; without one, bulk resume and reconcile are refused)",
    )
    serve.add_argument(
        "--forwarded-allow-ips",
        metavar="IPS",
        action="append",
        default=[],
        help="the addresses (or networks) of the TLS-terminating proxies in front of it, "
        "comma-separated: their Forwarded / X-Forwarded-Proto / X-Forwarded-Host are "
        "believed for the same-origin check (from other peers they are ignored); "
        "every request then needs the token",
    )


def _add_watch(watch: argparse.ArgumentParser) -> None:
    watch.add_argument("invocation_id", metavar="ID")
    watch.add_argument(
        "--from",
        dest="after",
        metavar="N",
        type=int,
        default=0,
        help="print the events after position N (default 0: all of them)",
    )
    watch.add_argument(
        "--json", action="store_true", help="one JSON object a line, as history --json prints"
    )
    db_option(watch)


ARGUMENTS: dict[str, AddArguments] = {"serve": _add_serve, "watch": _add_watch}
