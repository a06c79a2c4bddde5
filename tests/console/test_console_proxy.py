"""Behind a TLS-terminating proxy: ``--forwarded-allow-ips`` (``ConsoleSettings.forwarded_allow_ips``).

The browser's page is ``https://console.example``; the proxy forwards to the console on
loopback over http, saying so in ``X-Forwarded-Proto`` / ``X-Forwarded-Host`` or
``Forwarded``. The test client plays the proxy: its requests come from 127.0.0.1. A
request that passes the guard reaches the API, which answers 404 for the unknown
invocation ``x``; a refused one is 403 (or 421, 401) and records nothing.

Bad inputs tried: a proxied https origin without the option (refused), the same
headers forged by a peer the option does not name (refused), ``*`` and a name as the
proxy's address, the option without a token.
"""

from __future__ import annotations

import pytest

from loop_actors._errors import UsageError
from loop_actors.console import ConsoleSettings
from tests.support.console import TOKEN, bearer, client, serving

PAGE = "https://console.example"
CANCEL = "/api/invocations/x/cancel"
FORWARDED_HEADERS = [
    {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "console.example"},
    {"Forwarded": 'for=198.51.100.7;proto=https;host="console.example"'},
]


@pytest.mark.parametrize("forwarded", FORWARDED_HEADERS)
async def test_a_proxied_https_origin_is_refused_unless_the_proxy_is_named(
    forwarded: dict[str, str],
) -> None:
    headers = {**bearer(), "Origin": PAGE, **forwarded}
    async with serving("memory://") as base, client(base) as http:
        unnamed = await http.post(CANCEL, json={}, headers=headers)
    proxy = ["127.0.0.1"]
    async with serving("memory://", forwarded_allow_ips=proxy) as base, client(base) as http:
        named = await http.post(CANCEL, json={}, headers=headers)
        other_origin = await http.post(
            CANCEL, json={}, headers={**headers, "Origin": "https://evil.example"}
        )
        plain_http = await http.post(
            CANCEL, json={}, headers={**bearer(), "Origin": "http://console.example"}
        )
    assert unnamed.status_code == 403
    assert unnamed.json()["error"] == "cross_origin"
    assert named.status_code == 404, named.text  # through the guard: no invocation x
    assert other_origin.status_code == 403
    assert plain_http.status_code == 403  # no forwarded host: the origin is the Host's


async def test_forwarded_headers_from_a_peer_that_is_not_the_proxy_are_ignored() -> None:
    """The named proxy is 192.0.2.10; the test client (127.0.0.1) forges its headers."""
    forged = {**bearer(), "Origin": PAGE, **FORWARDED_HEADERS[0]}
    proxies = ["192.0.2.10/32", "10.0.0.0/8"]
    async with serving("memory://", forwarded_allow_ips=proxies) as base, client(base) as http:
        posted = await http.post(CANCEL, json={}, headers=forged)
        other_host = await http.get(
            "/api/invocations", headers={**forged, "Host": "console.example"}
        )
        direct = await http.post(CANCEL, json={}, headers=bearer())
    assert posted.status_code == 403
    assert posted.json()["error"] == "cross_origin"
    assert other_host.status_code == 421  # its Host is checked as any peer's
    assert direct.status_code == 404  # no browser headers: the token alone decides


async def test_behind_a_proxy_every_request_needs_the_token_and_the_cookie_is_secure() -> None:
    proxied = {"X-Forwarded-Proto": "https", "Host": "console.example"}
    async with serving("memory://", forwarded_allow_ips=["127.0.0.1"]) as base:
        async with client(base) as http:
            anonymous = await http.get("/api/invocations", headers=proxied)
            logged_in = await http.post("/login", data={"token": TOKEN}, headers=proxied)
        async with client(base, headers=bearer()) as http:
            read = await http.get("/api/invocations", headers=proxied)
    assert anonymous.status_code == 401
    assert logged_in.status_code == 303
    assert "secure" in logged_in.headers["set-cookie"].lower()
    assert read.status_code == 200  # the proxy's Host is its site's: not checked


@pytest.mark.parametrize(
    ("proxies", "says"),
    [
        (["*"], "addresses or networks"),
        (["proxy.internal"], "addresses or networks"),
        (["10.0.0.0/8, nonsense"], "'nonsense'"),
    ],
)
def test_a_proxy_that_is_not_an_address_is_refused(proxies: list[str], says: str) -> None:
    with pytest.raises(UsageError, match=says):
        ConsoleSettings.resolve(token=TOKEN, forwarded_allow_ips=proxies, environ={})


def test_behind_a_proxy_a_token_is_required() -> None:
    with pytest.raises(UsageError, match="behind a proxy"):
        ConsoleSettings.resolve(forwarded_allow_ips=["127.0.0.1"], environ={})
    settings = ConsoleSettings.resolve(forwarded_allow_ips=["127.0.0.1,::1"], token=TOKEN)
    assert settings.loopback
    assert settings.reads_need_token
    assert settings.trusts_proxy("::1")
    assert not settings.trusts_proxy("127.0.0.2")
