"""Bulk resume from the console's API: a dry run says which, a typed confirmation does it.

Run it from this folder: ``python console_bulk.py`` (needs the console extra,
``pip install 'loop-actors[console]'``). It records two refunds for workers to run
(``submit``) and runs a third until it waits for approval, then serves the console in
this process with the refund agent (as ``loop-actors serve --agent approvals:agent``)
and asks it, over HTTP with the standard library, to resume the agent's invocations:
first a dry run, then with the confirmation the dry run gave.
"""

import json
import secrets
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import trio
from approvals import GOAL, agent

from loop_actors import Runtime
from loop_actors.console import ConsoleSettings, serve_console

DB = "sqlite:///console_bulk.db"
FILES = ("console_bulk.db", "console_bulk.views.db")


def post(base: str, path: str, body: dict[str, Any], token: str) -> dict[str, Any]:
    """POST a JSON body with the token; the JSON answer (an error's too)."""
    request = urllib.request.Request(  # noqa: S310 - the console this script serves
        f"{base}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            answer: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as error:
        answer = json.load(error)
    return answer


async def main() -> None:
    async with Runtime(DB) as runtime:
        await runtime.submit(agent, "Refund order B-1.", invocation_id="bulk-1")
        await runtime.submit(agent, "Refund order B-2.", invocation_id="bulk-2")
        await runtime.run(agent, GOAL, invocation_id="bulk-3")  # waits for an approval
    token = secrets.token_urlsafe(24)
    settings = ConsoleSettings.resolve(db_url=DB, port=0, token=token)
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(partial(serve_console, settings, agents=[agent]))
        where = {"agent": "refunds"}

        def ask(body: dict[str, Any]) -> dict[str, Any]:
            return post(base, "/api/bulk/resume", {"where": where, **body}, token)

        dry = await trio.to_thread.run_sync(ask, {})
        print(f"dry run: {dry['matched']} to resume: {', '.join(dry['invocation_ids'])}")
        for skipped in dry["skipped"]:
            print(f"left alone: {skipped['invocation_id']} ({skipped['why']})")
        print(f"confirm with: {dry['confirm']}")
        wrong = await trio.to_thread.run_sync(
            ask, {"dry_run": False, "by": "ops", "confirm": "resume 3"}
        )
        print(f"resume 3: {wrong['error']}")
        done = await trio.to_thread.run_sync(
            ask, {"dry_run": False, "by": "ops", "confirm": dry["confirm"]}
        )
        for invocation_id, result in done["results"].items():
            print(f"{invocation_id}: {result}")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    for name in FILES:  # each run starts afresh
        Path(name).unlink(missing_ok=True)
    trio.run(main)
