"""Where the console listens, and its token: checked before anything is opened."""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from loop_actors._errors import UsageError

TOKEN_ENV = "LOOP_ACTORS_CONSOLE_TOKEN"  # noqa: S105 - a variable's name
"""The console's token, when ``--token`` is not given (else one is generated and printed)."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
MIN_TOKEN_LENGTH = 16
"""A token shorter than this is refused: it would be guessed."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) names this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ConsoleSettings:
    """How the console is served: its database, address and token."""

    db_url: str | None
    host: str
    port: int
    token: str
    token_generated: bool
    """True when no token was given: the console made one (and ``serve`` prints it)."""

    @property
    def loopback(self) -> bool:
        """Bound to loopback only: reads need no token (the Host header is still checked)."""
        return is_loopback(self.host)

    @classmethod
    def resolve(
        cls,
        *,
        db_url: str | None = None,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        token: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ConsoleSettings:
        """The settings from the options and ``$LOOP_ACTORS_CONSOLE_TOKEN`` (of ``environ``).

        Raises:
            UsageError: the port is not in 0..65535; the token is shorter than
                :data:`MIN_TOKEN_LENGTH`; bound beyond loopback without a token (a
                generated one would be printed where others may read it, and every
                request there needs one).
        """
        if not 0 <= port <= 65535:
            raise UsageError(f"--port must be 0..65535, got {port}")
        if not host.strip():
            raise UsageError("--host must not be empty")
        variables = os.environ if environ is None else environ
        given = token if token is not None else variables.get(TOKEN_ENV)
        if given is not None and len(given) < MIN_TOKEN_LENGTH:
            raise UsageError(f"the console token must have at least {MIN_TOKEN_LENGTH} characters")
        if given is None and not is_loopback(host):
            raise UsageError(
                f"refusing to serve on {host} (beyond loopback) without a token: every request "
                f"there needs one; give --token or ${TOKEN_ENV}"
            )
        if given is None:
            return cls(db_url, host, port, secrets.token_urlsafe(24), token_generated=True)
        return cls(db_url, host, port, given, token_generated=False)
