"""Local HTTP servers that speak the OpenAI and Anthropic wire formats, for adapter tests.

Each replays a script of (status, headers, JSON body) replies, one per request,
and records every request body and its headers, so tests can check what the SDKs sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, dict[str, str], dict[str, Any]]


class FakeProvider:
    """A scripted provider on 127.0.0.1 with an OS-chosen port."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.request_headers: list[dict[str, str]] = []
        """Each request's headers (``authorization``, ``x-api-key``...), names lower-cased."""
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                provider.requests.append(json.loads(self.rfile.read(length) or b"{}"))
                provider.paths.append(self.path)
                provider.request_headers.append({k.lower(): v for k, v in self.headers.items()})
                status, headers, body = (
                    provider.replies.pop(0)
                    if provider.replies
                    else (500, {}, {"error": {"message": "script exhausted"}})
                )
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"


@contextmanager
def serve(replies: list[Reply]) -> Iterator[FakeProvider]:
    """Run a fake provider for the duration of a block."""
    provider = FakeProvider(replies)
    provider.thread.start()
    try:
        yield provider
    finally:
        provider.server.shutdown()
        provider.server.server_close()


# --------------------------------------------------------------------------- OpenAI shapes


def openai_tool_calls(*calls: tuple[str, str, str], prompt: int = 10, completion: int = 5) -> Reply:
    """A Chat Completions reply asking for tool calls (id, name, arguments JSON text)."""
    return (
        200,
        {},
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                            for i, n, a in calls
                        ],
                    },
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        },
    )


def openai_text(text: str | None, *, refusal: str | None = None, finish: str = "stop") -> Reply:
    """A Chat Completions reply with text (or a refusal)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if refusal is not None:
        message["refusal"] = refusal
    return (
        200,
        {},
        {
            "id": "chatcmpl-2",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        },
    )


def openai_error(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    """An OpenAI error reply."""
    return (status, headers or {}, {"error": {"message": message, "type": "error", "code": None}})


# --------------------------------------------------------------------------- Anthropic shapes


def anthropic_reply(content: list[dict[str, Any]], *, stop: str = "end_turn") -> Reply:
    """A Messages API reply."""
    return (
        200,
        {},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 6},
        },
    )


def anthropic_tool_use(*calls: tuple[str, str, dict[str, Any]]) -> Reply:
    """A reply asking for tool uses (id, name, input)."""
    return anthropic_reply(
        [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls],
        stop="tool_use",
    )


def anthropic_text(text: str) -> Reply:
    """A text reply."""
    return anthropic_reply([{"type": "text", "text": text}])


def anthropic_error(status: int, kind: str, headers: dict[str, str] | None = None) -> Reply:
    """An Anthropic error reply."""
    return (status, headers or {}, {"type": "error", "error": {"type": kind, "message": kind}})
