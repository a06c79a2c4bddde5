"""Follow an invocation's events from the console's stream, picking up after a dropped connection.

    python follow_stream.py http://127.0.0.1:8765 INVOCATION_ID [--drop-after N]

Reads ``GET /api/invocations/ID/events`` (server-sent events) with the standard
library only. Each event's ``id`` is its position in the invocation's history; when
the connection drops, the client connects again with ``Last-Event-ID`` set to the
last one it saw, and the server sends exactly the events after it. ``--drop-after N``
drops the first connection after N events on purpose, to show it. Stops after
``Terminated``. Set ``LOOP_ACTORS_CONSOLE_TOKEN`` when the console needs the token
for reads (bound beyond loopback).
"""

import argparse
import json
import os
import urllib.request
from collections.abc import Iterator
from typing import Any


def server_sent_events(url: str, last_event_id: int) -> Iterator[dict[str, str]]:
    """The events of one connection, each as its fields (id, event, data)."""
    if not url.startswith(("http://", "https://")):
        raise SystemExit(f"not an http(s) URL: {url}")
    request = urllib.request.Request(url, headers={"Accept": "text/event-stream"})  # noqa: S310
    if last_event_id:
        request.add_header("Last-Event-ID", str(last_event_id))
    token = os.environ.get("LOOP_ACTORS_CONSOLE_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - checked above
        fields: dict[str, str] = {}
        for raw in response:
            line = raw.decode().rstrip("\r\n")
            if not line:  # a blank line ends an event
                if "data" in fields:
                    yield fields
                fields = {}
            elif not line.startswith(":"):  # ":" starts a keep-alive comment
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")


def follow(base: str, invocation_id: str, drop_after: int | None) -> list[dict[str, Any]]:
    """Every event of the invocation once, in order, reconnecting after a drop."""
    url = f"{base}/api/invocations/{invocation_id}/events"
    seen: list[dict[str, Any]] = []
    last = 0
    while True:
        try:
            for event in server_sent_events(url, last):
                record = json.loads(event["data"])
                seen.append(record)
                last = int(event["id"])
                print(f"{last:>3} {event['event']}")
                if event["event"] == "Terminated":
                    return seen
                if drop_after is not None and len(seen) == drop_after:
                    drop_after = None
                    raise ConnectionResetError("dropped on purpose")
        except (ConnectionError, TimeoutError) as error:
            print(f"connection lost ({error}); again from Last-Event-ID {last}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", help="the console's address, e.g. http://127.0.0.1:8765")
    parser.add_argument("invocation_id")
    parser.add_argument("--drop-after", type=int)
    args = parser.parse_args()
    records = follow(args.base.rstrip("/"), args.invocation_id, args.drop_after)
    print(f"{len(records)} events, each once; it ended {records[-1]['data']['reason']}")


if __name__ == "__main__":
    main()
