"""Take-overs that race: every loser says another process drives the invocation (exit 6).

Three ``loop-actors resume --take-over`` processes start at once on an invocation that a
live ``loop-actors run`` drives (its tool takes seconds). Each takes the lease in turn and
fences the one before; a process fenced after it took its lease stops ``lease_lost``,
one whose lease record came after a newer one is refused with ``LeaseHeldError``. Both
used to answer with exit codes that say something else (4, "the invocation ended
with another reason"; 2, "bad usage"), though the invocation went on, and completed,
in another process. Real processes, one SQLite file.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import trio

from loop_actors import Runtime
from tests.support.cli import CLI, cli_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

AGENT = '''
import pathlib, time
from loop_actors import Agent, ScriptedModel, tool

@tool
def look_up(key: str) -> str:
    """A slow read: long enough for every take-over to overlap the others."""
    pathlib.Path(f"inside-{__import__('os').getpid()}").write_text("1")
    time.sleep(float(pathlib.Path("tool-seconds").read_text()))
    return key

def decide(request):
    if request.step == 1:
        return {"kind": "tool_calls",
                "calls": [{"id": "c1", "name": "look_up", "arguments": {"key": "k"}}]}
    return {"kind": "final", "answer": "done"}

agent = Agent("racer", ScriptedModel(decide), tools=[look_up])
'''


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args, "--db", f"sqlite:///{tmp_path / 'store.db'}"],
        cwd=tmp_path,
        env=cli_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}"),  # this tree's code
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_racing_take_overs_answer_exit_6_except_the_one_that_completes(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(AGENT)
    (tmp_path / "tool-seconds").write_text("30")
    holder = _start(tmp_path, "run", "agents:agent", "--goal", "g", "--id", "inv-1")
    racers: list[subprocess.Popen[str]] = []
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("inside-*")):
            assert holder.poll() is None, holder.communicate()
            assert time.monotonic() < deadline, "the holder's tool never ran"
            time.sleep(0.02)
        (tmp_path / "tool-seconds").write_text("3")
        racers = [
            _start(tmp_path, "resume", "inv-1", "--agent", "agents:agent", "--take-over")
            for _ in range(3)
        ]
        answers = [(p.wait(timeout=120), *p.communicate()) for p in racers]
        holder.kill()  # it sleeps in its tool; fenced, it could not record anything more
        holder.communicate()
    finally:
        for process in [holder, *racers]:
            if process.poll() is None:
                process.kill()
                process.communicate()

    codes = sorted(code for code, _, _ in answers)
    assert set(codes) <= {0, 6}, answers
    assert codes.count(0) == 1, answers
    for code, out, err in answers:
        if code == 6:  # lease_lost after its take-over, or refused for the newer lease
            assert out.startswith("lease_lost\n") or "took the invocation over" in err, (out, err)
    history = trio.run(Runtime(f"sqlite:///{tmp_path / 'store.db'}").history, "inv-1")
    events = [type(e).__name__ for e in history]
    assert events.count("Terminated") == 1
    assert events[-1] == "Terminated"
