"""Where the console listens, and its token: checked before anything is opened."""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loop_actors._errors import UsageError

TOKEN_ENV = "LOOP_ACTORS_CONSOLE_TOKEN"  # noqa: S105 - a variable's name
"""The console's token, when ``--token`` is not given (else one is generated and printed)."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
MIN_TOKEN_LENGTH = 16
"""A token shorter than this is refused: it would be guessed."""


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(entries: Sequence[str]) -> tuple[Network, ...]:
    """The proxies' addresses of ``--forwarded-allow-ips``: each an address or a network.

    Raises:
        UsageError: an entry that is neither (``*`` included: every peer could then
            forge where a request came from).
    """
    networks = []
    for entry in (part.strip() for text in entries for part in text.split(",")):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            raise UsageError(
                f"--forwarded-allow-ips takes the proxies' addresses or networks "
                f"(127.0.0.1, 10.0.0.0/8, ::1), got {entry!r}"
            ) from None
    return tuple(networks)


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
    forwarded_allow_ips: tuple[Network, ...] = ()
    """The proxies whose ``Forwarded`` / ``X-Forwarded-Proto`` / ``X-Forwarded-Host`` it
    believes (``serve --forwarded-allow-ips``); none by default."""

    @property
    def loopback(self) -> bool:
        """Bound to loopback only (the Host header is still checked)."""
        return is_loopback(self.host)

    @property
    def behind_proxy(self) -> bool:
        """Served through a proxy the operator named: reachable from beyond this machine."""
        return bool(self.forwarded_allow_ips)

    @property
    def reads_need_token(self) -> bool:
        """Every request needs the token: bound beyond loopback, or behind a proxy."""
        return not self.loopback or self.behind_proxy

    def trusts_proxy(self, peer: str | None) -> bool:
        """Whether the peer ``peer`` (an address) is one of the proxies it was told of."""
        if peer is None or not self.forwarded_allow_ips:
            return False
        try:
            address = ipaddress.ip_address(peer.strip("[]"))
        except ValueError:  # a Unix socket's peer, a name: no proxy it was told of
            return False
        return any(address in network for network in self.forwarded_allow_ips)

    @classmethod
    def resolve(
        cls,
        *,
        db_url: str | None = None,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        token: str | None = None,
        forwarded_allow_ips: Sequence[str] = (),
        environ: Mapping[str, str] | None = None,
    ) -> ConsoleSettings:
        """The settings from the options and ``$LOOP_ACTORS_CONSOLE_TOKEN`` (of ``environ``).

        ``forwarded_allow_ips``: the addresses (or networks, ``10.0.0.0/8``; entries
        may be comma-separated) of the TLS-terminating proxies in front of it, whose
        forwarded scheme and host it believes for the same-origin check.

        Raises:
            UsageError: the port is not in 0..65535; the token is shorter than
                :data:`MIN_TOKEN_LENGTH`; bound beyond loopback, or behind a proxy,
                without a token (a generated one would be printed where others may
                read it, and every request there needs one); a proxy entry that is
                not an address or a network.
        """
        if not 0 <= port <= 65535:
            raise UsageError(f"--port must be 0..65535, got {port}")
        if not host.strip():
            raise UsageError("--host must not be empty")
        variables = os.environ if environ is None else environ
        given = token if token is not None else variables.get(TOKEN_ENV)
        if given is not None and len(given) < MIN_TOKEN_LENGTH:
            raise UsageError(f"the console token must have at least {MIN_TOKEN_LENGTH} characters")
        proxies = parse_networks(forwarded_allow_ips)
        if given is None and not is_loopback(host):
            raise UsageError(
                f"refusing to serve on {host} (beyond loopback) without a token: every request "
                f"there needs one; give --token or ${TOKEN_ENV}"
            )
        if given is None and proxies:
            raise UsageError(
                "refusing to serve behind a proxy (--forwarded-allow-ips) without a token: "
                f"every request through it needs one; give --token or ${TOKEN_ENV}"
            )
        if given is None:
            return cls(db_url, host, port, secrets.token_urlsafe(24), True, proxies)
        return cls(db_url, host, port, given, False, proxies)
