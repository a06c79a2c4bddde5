"""The console's guard: Host check, token, same-origin check and security headers.

An ASGI middleware around the whole app, so that no route can forget it:

- every request's ``Host`` must name this machine when the console is bound to
  loopback (a DNS-rebinding page at ``attacker.example`` that resolves to 127.0.0.1 is
  refused, ``421 Misdirected Request``); bound to one other address, it must name
  that address or loopback;
- every mutating request (anything but GET, HEAD and OPTIONS) needs the token as
  ``Authorization: Bearer …`` (``401``, nothing recorded) and, when a browser sends
  ``Origin`` or ``Sec-Fetch-Site``, to come from the console's own origin (``403``);
- behind a TLS-terminating proxy the operator named (``--forwarded-allow-ips``), a
  request from that proxy's address is taken at the scheme and host it forwards
  (``Forwarded: proto=…;host=…``, else ``X-Forwarded-Proto`` / ``X-Forwarded-Host``):
  the console's own origin is then ``https://console.example``; the proxy picked the
  site, so its ``Host`` is not checked. The same headers from any other peer are
  ignored (a forged ``X-Forwarded-Proto`` changes nothing);
- bound beyond loopback, or behind a proxy, every request needs the token (the
  header, or the ``HttpOnly`` ``SameSite=Strict`` cookie ``POST /login`` sets for pages);
- every response carries a Content-Security-Policy that allows only the console's
  own script and style (no inline script, nothing from elsewhere) and
  ``frame-ancestors 'none'``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any

from loop_actors.console.settings import ConsoleSettings, is_loopback

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
COOKIE = "loop_actors_console"
"""The cookie ``POST /login`` sets (beyond loopback, pages are read with it)."""
LOGIN_PATH = "/login"
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]"})  # noqa: S104 - names, compared


def allowed_hosts(settings: ConsoleSettings) -> frozenset[str] | None:
    """The host names a request's ``Host`` may give; None when any may (a wildcard bind)."""
    if settings.host in WILDCARD_HOSTS:
        return None
    names = {"localhost", "127.0.0.1", "[::1]", "::1"}
    names.add(settings.host.lower())
    return frozenset(names)


def host_name(host_header: str) -> str:
    """The name part of a ``Host`` header (no port; an IPv6 literal keeps its brackets)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class ConsoleGuard:
    """The middleware: refuses what the module docstring lists, adds the security headers."""

    def __init__(self, app: ASGIApp, settings: ConsoleSettings) -> None:
        self.app = app
        self.settings = settings
        self.hosts = allowed_hosts(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a refused request here; pass the others on, with the security headers."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        host = headers.get("host", "")
        client = scope.get("client")
        proxied = self.settings.trusts_proxy(client[0] if client else None)
        if proxied:
            scheme, forwarded_host = forwarded(headers)
            scope = {**scope, "scheme": scheme or scope.get("scheme", "http")}
            host = forwarded_host or host
        elif self.hosts is not None and host_name(host) not in self.hosts:
            await _refuse(send, 421, "wrong_host", f"this console does not answer for {host!r}")
            return
        method = scope["method"]
        path = scope["path"]
        mutating = method not in SAFE_METHODS
        if mutating:
            problem = _cross_origin(headers, scope, host)
            if problem is not None:
                await _refuse(send, 403, "cross_origin", problem)
                return
        needs_token = path != LOGIN_PATH and (mutating or self.settings.reads_need_token)
        if needs_token and not self._authorised(headers, cookie_too=not mutating):
            await _refuse(
                send,
                401,
                "unauthorised",
                "this request needs the console's token (Authorization: Bearer TOKEN)",
            )
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _authorised(self, headers: dict[str, str], *, cookie_too: bool) -> bool:
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.matches(given.strip()):
            return True
        if cookie_too and "cookie" in headers:
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(headers["cookie"])
            except Exception:  # a malformed cookie header is no token
                return False
            morsel = jar.get(COOKIE)
            return morsel is not None and self.matches(morsel.value)
        return False

    def matches(self, given: str) -> bool:
        """Whether ``given`` is the token (compared in constant time)."""
        return token_matches(given, self.settings.token)


def token_matches(given: str, token: str) -> bool:
    """Whether ``given`` is ``token``, compared in constant time."""
    return secrets.compare_digest(given.encode(), token.encode())


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (the last of repeated ones)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def forwarded(headers: dict[str, str]) -> tuple[str | None, str | None]:
    """The scheme and host a proxy forwarded: ``Forwarded`` (RFC 7239), else ``X-Forwarded-*``.

    Of a list (proxies in a chain), the first: what the client asked the first proxy.
    A scheme other than ``http`` or ``https`` is ignored.
    """
    proto: str | None = None
    host: str | None = None
    if "forwarded" in headers:
        first = headers["forwarded"].split(",", 1)[0]
        for pair in first.split(";"):
            name, _, value = pair.strip().partition("=")
            value = value.strip().strip('"')
            if name.lower() == "proto":
                proto = value.lower()
            elif name.lower() == "host":
                host = value
    else:
        if "x-forwarded-proto" in headers:
            proto = headers["x-forwarded-proto"].split(",", 1)[0].strip().lower()
        if "x-forwarded-host" in headers:
            host = headers["x-forwarded-host"].split(",", 1)[0].strip()
    return (proto if proto in ("http", "https") else None), (host or None)


def _cross_origin(headers: dict[str, str], scope: Scope, host: str) -> str | None:
    """Why a mutating request is not from the console's own page; None if it is (or no browser)."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a mutating request must come from the console's own page (Sec-Fetch-Site: {site})"
    origin = headers.get("origin")
    if origin is not None and origin != f"{scope.get('scheme', 'http')}://{host}":
        return f"a mutating request must come from the console's own origin, not {origin!r}"
    return None


async def _refuse(send: Send, status: int, error: str, detail: str) -> None:
    """Answer with a JSON error (and the security headers); the app is not called."""
    body = json.dumps({"error": error, "detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *SECURITY_HEADERS,
    ]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="loop-actors console"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = [
    "COOKIE",
    "CSP",
    "ConsoleGuard",
    "allowed_hosts",
    "forwarded",
    "host_name",
    "is_loopback",
    "token_matches",
]
