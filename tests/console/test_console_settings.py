"""``ConsoleSettings.resolve``: where the console may listen, and with which token.

Bad inputs tried: beyond loopback without a token (an address, a wildcard, a host
name), a token too short, a port out of range, an empty host.
"""

from __future__ import annotations

import pytest

from loop_actors._errors import UsageError
from loop_actors.console import TOKEN_ENV, ConsoleSettings

TOKEN = "a-token-of-24-characters"


def test_on_loopback_a_token_is_generated_when_none_is_given() -> None:
    settings = ConsoleSettings.resolve(environ={})
    assert settings.loopback
    assert settings.token_generated
    assert len(settings.token) >= 24
    assert ConsoleSettings.resolve(environ={}).token != settings.token


def test_the_token_comes_from_the_option_else_the_environment() -> None:
    from_env = ConsoleSettings.resolve(environ={TOKEN_ENV: TOKEN})
    given = ConsoleSettings.resolve(token="another-token-of-24-chars", environ={TOKEN_ENV: TOKEN})
    assert (from_env.token, from_env.token_generated) == (TOKEN, False)
    assert given.token == "another-token-of-24-chars"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "console.example"])  # noqa: S104
def test_beyond_loopback_a_token_is_required(host: str) -> None:
    with pytest.raises(UsageError, match="without a token"):
        ConsoleSettings.resolve(host=host, environ={})
    assert not ConsoleSettings.resolve(host=host, environ={TOKEN_ENV: TOKEN}).loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"])
def test_loopback_names_need_no_token(host: str) -> None:
    assert ConsoleSettings.resolve(host=host, environ={}).loopback


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"token": "short"}, "at least 16"),
        ({"port": 65536}, "0..65535"),
        ({"port": -1}, "0..65535"),
        ({"host": " "}, "must not be empty"),
    ],
)
def test_malformed_settings_are_refused(options: dict[str, object], says: str) -> None:
    with pytest.raises(UsageError, match=says):
        ConsoleSettings.resolve(environ={}, **options)  # type: ignore[arg-type]
