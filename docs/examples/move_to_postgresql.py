"""Move a SQLite store into PostgreSQL, check the copy, and go on working there.

Run: python move_to_postgresql.py postgresql://user:password@host:port/dbname
(an empty database). It makes a SQLite store of two invocations in the current
folder, one of them paused for an approval, takes a checkpoint of it, copies it
with `loop-actors store copy`, checks the copy against the checkpoint, then
approves and resumes the paused invocation on PostgreSQL.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, tool

SQLITE = "sqlite:///before-move.db"


@tool
def lookup(order: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order": order, "amount": 40}


@tool(effect="write", requires_approval=True)
def refund(order: str, amount: int) -> dict[str, Any]:
    """Refund an order (a person approves it first)."""
    return {"refunded": order, "amount": amount}


def decide(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "lookup", "arguments": {"order": request.goal}}],
        }
    if request.step == 2 and "refund" in request.goal:
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "c2", "name": "refund", "arguments": {"order": request.goal, "amount": 40}}
            ],
        }
    return {"kind": "final", "answer": f"done: {request.goal}"}


agent = Agent("orders", ScriptedModel(decide), [lookup, refund])


def loop_actors(*args: str) -> str:
    """Run the `loop-actors` command (installed next to this interpreter)."""
    command = shutil.which("loop-actors", path=str(Path(sys.executable).parent)) or "loop-actors"
    done = subprocess.run([command, *args], capture_output=True, text=True, check=False)  # noqa: S603 (our own command)
    print(f"loop-actors {args[0]} {args[1]}: exit {done.returncode}")
    return done.stdout


async def main(postgres: str) -> None:
    # The store as it was: SQLite, one finished invocation and one waiting for approval.
    async with Runtime(SQLITE) as before:
        print((await before.run(agent, "look up 1042", invocation_id="o-1")).reason)
        paused = await before.run(agent, "refund 1043", invocation_id="o-2")
        print(paused.reason)
    # Stop its writers (done: the runtime above is closed), checkpoint it, copy it.
    loop_actors("audit", "checkpoint", "--db", SQLITE, "--out", "before-move.txt")
    copied = loop_actors("store", "copy", "--from", SQLITE, "--to", postgres)
    print(copied.splitlines()[1].split(" (")[-1].rstrip(")"))  # "the same as the source's"
    loop_actors("audit", "verify", "--against", "before-move.txt", "--db", postgres)
    # Go on working on PostgreSQL.
    async with Runtime(postgres) as after:
        assert paused.digest is not None
        await after.approve("o-2", digest=paused.digest, by="alice")
        resumed = await after.resume("o-2", agent)
        print(resumed.reason, "-", resumed.answer)
        print(len(await after.history("o-2")), "events of o-2 on PostgreSQL")


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
