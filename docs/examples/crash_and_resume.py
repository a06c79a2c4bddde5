"""Kill the payments agent right after its first payment, resume it, count the payments.

Everything happens in a new temporary folder, so every run starts afresh.
"""

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import trio
from payments_agent import PaymentService, agent

from loop_actors import Runtime

SCRIPT = Path(__file__).with_name("payments_agent.py")
INVOCATION_ID = "pay-1"


def payments_agent(*args: str, crash_at: str | None = None) -> int:
    """Run payments_agent.py in a new process, print its output, return its exit code."""
    env = dict(os.environ)
    env.pop("LOOP_ACTORS_CRASH_AT", None)
    if crash_at is not None:
        env["LOOP_ACTORS_CRASH_AT"] = crash_at  # a testing aid: SIGKILL at that point
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, check=False
    )
    print(done.stdout, end="")
    return done.returncode


async def inspect(db_url: str) -> None:
    async with Runtime(db_url) as runtime:
        # Resuming an invocation that already ended returns its outcome; nothing runs.
        again = await runtime.resume(INVOCATION_ID, agent)
        print("resumed again:", again.reason)
        invocation = await runtime.load(INVOCATION_ID)
        for turn in invocation.turns:
            for result in turn.results:
                print(f"{result.call_id} {result.name}: {result.effect_status}")
        # The sweeper: settles open effects of this agent's invocations.
        report = await runtime.reconcile(agent)
        print(f"sweep: settled={report.effects_settled} open={report.effects_open}")


with tempfile.TemporaryDirectory() as folder:
    db_url = f"sqlite:///{Path(folder) / 'loop-actors.db'}"
    os.environ["LOOP_ACTORS_DB"] = db_url
    os.environ["PAYMENTS_DB"] = str(Path(folder) / "payments.db")

    # 1. Die (SIGKILL) right after the first payment returned, before anything of it
    #    was recorded: the service has bob's payment, the event store does not.
    code = payments_agent(
        "run", INVOCATION_ID, "Pay bob 30 and carol 20", crash_at="after_write_returned:1"
    )
    print("run:", "killed by SIGKILL" if code == -signal.SIGKILL else f"exit {code}")

    # 2. Resume in a new process, from the committed events.
    code = payments_agent("resume", INVOCATION_ID)
    print("resume: exit", code)

    trio.run(inspect, db_url)
    for recipient, amount, requests in PaymentService().payments():
        print(f"service: {recipient} {amount}, {requests} request(s) with its key")
