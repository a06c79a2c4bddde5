"""A store written by a newer loop-actors is refused, with a message that says so.

A newer version may add a field to an event, an event class, or an audit format. None
of it is guessed at or dropped: the row is unreadable here (``UnreadableEventError``,
CLI exit 4) and the message says it may come from a newer version, to be read with it.

Bad inputs tried, each on the second row of a finished invocation, read by ``history``
and ``resume`` (CLI) and ``Runtime.history``: an ``audit_format`` of 3, a field this
version does not have, a topic naming an event class of ``aggregates`` this version
does not have. A row damaged otherwise (a field of the wrong type) does not get the hint.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from aggregates.audit import PACKED_DEFLATE, pack_state, unpack_state
from loop_actors import Runtime, UnreadableEventError
from loop_actors._version import __version__
from tests.support.cli import run_cli

AGENT_MODULE = """
from loop_actors import Agent, ScriptedModel

AGENT = Agent("answerer", ScriptedModel([{"kind": "final", "answer": "42"}]), [])
"""

HINT = f"written by a newer loop-actors than this one ({__version__})"

_stores: dict[str, Path] = {}


@pytest.fixture
def folder(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of a store with one completed invocation ``a``, and the agent's module."""
    if "store" not in _stores:
        built = tmp_path_factory.mktemp("newer-version")
        (built / "answer_app.py").write_text(AGENT_MODULE)
        ran = run_cli(
            "run", "answer_app:AGENT", "--goal", "g", "--id", "a", cwd=built, db="sqlite:///s.db"
        )
        assert ran.returncode == 0, ran.stderr
        _stores["store"] = built / "s.db"
    shutil.copyfile(_stores["store"], tmp_path / "s.db")
    (tmp_path / "answer_app.py").write_text(AGENT_MODULE)
    return tmp_path


def edit_second_row(
    db: Path, edit: Callable[[dict[str, object]], None], topic: str | None = None
) -> None:
    """Rewrite the state of invocation ``a``'s second row (its decision) as ``edit`` says."""
    connection = sqlite3.connect(db)
    (state,) = connection.execute(
        "SELECT state FROM stored_events WHERE originator_id = 'a' AND originator_version = 2"
    ).fetchone()
    plain = unpack_state(state)
    fields = json.loads(plain)
    edit(fields)
    packed = pack_state(
        json.dumps(fields, separators=(",", ":")).encode(), deflate=state[0] == PACKED_DEFLATE
    )
    with connection:
        connection.execute(
            "UPDATE stored_events SET state = ?, topic = COALESCE(?, topic) "
            "WHERE originator_id = 'a' AND originator_version = 2",
            (packed, topic),
        )
    connection.close()


NEWER = {
    "audit format 3": (lambda fields: fields.update(audit_format=3), None),
    "a field this version lacks": (lambda fields: fields.update(confidence=0.9), None),
    "an event class this version lacks": (
        lambda fields: None,
        "aggregates.invocation_events:DecisionRevised",
    ),
}


@pytest.mark.parametrize("change", list(NEWER))
def test_a_row_of_a_newer_version_is_refused_saying_so(folder: Path, change: str) -> None:
    edit, topic = NEWER[change]
    edit_second_row(folder / "s.db", edit, topic)
    for command in (("history", "a"), ("resume", "a", "--agent", "answer_app:AGENT")):
        refused = run_cli(*command, cwd=folder, db="sqlite:///s.db")
        assert refused.returncode == 4, (command, refused.stdout, refused.stderr)
        assert HINT in refused.stderr, (command, refused.stderr)
        assert "Traceback" not in refused.stderr

    async def read() -> None:
        await Runtime(f"sqlite:///{folder / 's.db'}").history("a")

    with pytest.raises(UnreadableEventError) as refused_here:
        trio.run(read)
    assert HINT in str(refused_here.value)
    assert refused_here.value.position == 2


def test_a_row_damaged_otherwise_is_not_blamed_on_a_newer_version(folder: Path) -> None:
    edit_second_row(folder / "s.db", lambda fields: fields.update(timestamp="not a time"))
    refused = run_cli("history", "a", cwd=folder, db="sqlite:///s.db")
    assert refused.returncode == 4, refused.stderr
    assert "newer loop-actors" not in refused.stderr
