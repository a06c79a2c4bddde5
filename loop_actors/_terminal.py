"""Text from outside (a model, a tool, a service) made safe to print on a terminal.

Apart from ``loop_actors._render`` (rich), so that the commands that print plain lines
and every error message import no renderer.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: object) -> str:
    r"""Text from a model, a tool or a service as it may reach an operator's terminal.

    C0 and C1 control characters (but newline and tab) and DEL are shown as escapes
    (``\x1b``), so an answer holding ``\x1b[31m`` cannot drive the terminal; so are
    lone surrogates (which a terminal cannot be sent at all).
    """
    value = text if isinstance(text, str) else str(text)
    return _CONTROL.sub(_escape, value)
