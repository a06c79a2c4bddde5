"""Reflection survives SIGKILL: a run killed between an answer and its verdict, resumed.

The agent with a critic (``tests/support/critic_app.py``) runs in a real subprocess
with one crash point armed; the SQLite file it leaves is then resumed by a new
``Runtime`` in this process. Whatever the point, the run completes with the revised
answer, each round is recorded once, and only what was not committed is asked again:
the critic when the verdict was not durable, the agent's model when its revision was not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import trio

from aggregates.critic import Verdict
from aggregates.invocation import CritiqueReturned, DecisionProposed, Invocation, Phase
from loop_actors import Runtime, TerminalReason
from loop_actors.store.store import EventStore
from tests.support import critic_app
from tests.support.cli import run_cli
from tests.support.history import assert_history_is_whole

pytestmark = pytest.mark.slow

APP = Path(critic_app.__file__)
ID = "r-crash"


def crashed_run(tmp_path: Path, crash_at: str) -> str:
    """Run the agent until the crash point kills it; the store's URL."""
    shutil.copy(APP, tmp_path / "critic_app.py")
    db = f"sqlite:///{tmp_path / 'run.db'}"
    killed = run_cli(
        "run", "critic_app:agent", "--goal", critic_app.GOAL, "--id", ID,
        cwd=tmp_path, db=db, env={"LOOP_ACTORS_CRASH_AT": crash_at},
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    return db


def stored(db: str) -> Invocation:
    store = EventStore(db, create=False)
    try:
        invocation = store.get(ID)
    finally:
        store.close()
    assert isinstance(invocation, Invocation)
    return invocation


@pytest.mark.parametrize(
    ("crash_at", "left", "asked_again"),
    [
        # The first answer is durable, the critic's first verdict is not: asked again.
        ("before_critique", (2, 0), ["critic:1", "agent:3", "critic:2"]),
        # The revise verdict is durable; the agent's model was not asked for its revision.
        ("after_critique_commit", (2, 1), ["agent:3", "critic:2"]),
        # The revised answer is durable, the critic's second verdict is not.
        ("before_critique:2", (3, 1), ["critic:2"]),
    ],
)
async def test_a_run_killed_mid_reflection_resumes_in_a_new_runtime_from_its_sqlite_file(
    tmp_path: Path, crash_at: str, left: tuple[int, int], asked_again: list[str]
) -> None:
    db = crashed_run(tmp_path, crash_at)
    before = stored(db)
    assert (before.step, before.critic_spent.rounds) == left
    assert before.phase is (Phase.READY if crash_at == "after_critique_commit" else Phase.DECIDED)

    asked: list[str] = []
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.resume(ID, critic_app.counted_agent(asked))
            events = await runtime.history(ID)
    whole = run_cli("history", ID, "--json", cwd=tmp_path, db=db)

    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.answer == critic_app.ANSWER
    assert asked == asked_again
    rounds = [(e.round, e.step, e.verdict) for e in events if isinstance(e, CritiqueReturned)]
    assert rounds == [(1, 2, Verdict.REVISE), (2, 3, Verdict.ACCEPT)]
    assert [e.step for e in events if isinstance(e, DecisionProposed)] == [1, 2, 3]
    assert_history_is_whole([json.loads(line) for line in whole.stdout.splitlines()])
