"""A stored topic that is not one of loop-actors' event classes is never imported.

A topic is a module path (``module:Class``): eventsourcing's ``resolve_topic`` imports
the module it names. A row whose topic was changed by hand (``this:s`` printed the Zen
of Python, then exit 1), or a first event whose ``originator_topic`` (the aggregate's
class, resolved when the aggregate is built) was, is an unreadable row: a typed
``UnreadableEventError`` naming the row, exit 4 from the CLI, and nothing imported.

Bad inputs tried: the stored topic of an invocation's second row set to ``this:s`` and
to ``tripwire:Event`` (a module beside the store that leaves a file when imported), and
the ``originator_topic`` inside its ``InvocationStarted`` set to ``tripwire:Event``; each
read by ``history`` (text and JSON), ``show``, ``list``, ``metrics``, ``effects``,
``projections catch-up`` and ``resume``, and through ``Runtime.history``/``resume``.
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from aggregates.audit import PACKED_DEFLATE, pack_state, unpack_state
from loop_actors import Runtime, UnreadableEventError
from tests.support.cli import run_cli, run_in_process

AGENT_MODULE = textwrap.dedent(
    '''
    from loop_actors import Agent, Reconciled, ScriptedModel, tool

    @tool(effect="write", reconcile=lambda amount: Reconciled(status="not_found"))
    async def charge(amount: int) -> dict:
        """Charge an amount."""
        return {"amount": amount}

    def decide(request):
        if request.step == 1:
            call = {"id": "c1", "name": "charge", "arguments": {"amount": 40}}
            return {"kind": "tool_calls", "calls": [call]}
        return {"kind": "final", "answer": "charged"}

    AGENT = Agent("payer", ScriptedModel(decide), [charge])
    '''
)

TRIPWIRE = textwrap.dedent(
    """
    from pathlib import Path
    Path(__file__).with_name("imported.txt").write_text("imported")
    Event = object
    """
)

ZEN = "Beautiful is better than ugly"

_stores: dict[str, Path] = {}


def _built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with two completed paying invocations, p then q (built once)."""
    if "store" not in _stores:
        folder = tmp_path_factory.mktemp("foreign-topics")
        (folder / "payer_app.py").write_text(AGENT_MODULE)
        ran = run_cli(
            "run", "payer_app:AGENT", "--goal", "pay", "--id", "p", cwd=folder, db="sqlite:///e.db"
        )
        assert ran.returncode == 0, ran.stderr
        ran = run_cli(
            "run", "payer_app:AGENT", "--goal", "pay", "--id", "q", cwd=folder, db="sqlite:///e.db"
        )
        assert ran.returncode == 0, ran.stderr
        _stores["store"] = folder / "e.db"
    return _stores["store"]


@pytest.fixture
def folder(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A folder with a copy of the store, the agent's module and the tripwire module.

    The folder is on ``sys.path`` (as the working folder of ``python -m`` is), so that a
    reader that resolved the topic would import the tripwire.
    """
    shutil.copyfile(_built(tmp_path_factory), tmp_path / "e.db")
    (tmp_path / "payer_app.py").write_text(AGENT_MODULE)
    (tmp_path / "tripwire.py").write_text(TRIPWIRE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def set_topic(db: Path, invocation_id: str, version: int, topic: str) -> None:
    connection = sqlite3.connect(db)
    with connection:
        changed = connection.execute(
            "UPDATE stored_events SET topic = ? WHERE originator_id = ? AND originator_version = ?",
            (topic, invocation_id, version),
        ).rowcount
    connection.close()
    assert changed == 1


def set_originator_topic(db: Path, invocation_id: str, topic: str) -> None:
    """Edit the aggregate class named inside the first event, as its packed state holds it."""
    connection = sqlite3.connect(db)
    (state,) = connection.execute(
        "SELECT state FROM stored_events WHERE originator_id = ? AND originator_version = 1",
        (invocation_id,),
    ).fetchone()
    plain = unpack_state(state)
    edited = plain.replace(b'"aggregates.invocation:Invocation"', f'"{topic}"'.encode())
    assert edited != plain
    with connection:
        connection.execute(
            "UPDATE stored_events SET state = ? WHERE originator_id = ? AND originator_version = 1",
            (pack_state(edited, deflate=state[0] == PACKED_DEFLATE), invocation_id),
        )
    connection.close()


COMMANDS = [
    ("history", "q"),
    ("history", "q", "--json"),
    ("show", "q"),
    ("show", "p"),
    ("list",),
    ("metrics",),
    ("effects",),
    ("projections", "catch-up"),
    ("resume", "q", "--agent", "payer_app:AGENT"),
]


@pytest.mark.parametrize("topic", ["this:s", "tripwire:Event"])
def test_no_reader_imports_the_module_a_stored_topic_names(
    folder: Path, topic: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every reading command refuses the row (or skips it) typed; none imports its module."""
    set_topic(folder / "e.db", "q", 2, topic)
    zen_imported = "this" in sys.modules
    for command in COMMANDS:
        done = run_in_process(
            *command, cwd=folder, db="sqlite:///e.db", capsys=capsys, monkeypatch=monkeypatch
        )
        assert not (folder / "imported.txt").exists(), command
        assert ZEN not in done.stdout + done.stderr, command
        assert ("this" in sys.modules) == zen_imported, command
        assert done.returncode != 1, (command, done.stderr)
        assert "internal error" not in done.stderr, command
        if command[0] in ("history", "resume"):
            assert done.returncode == 4, (command, done.stderr)
            assert f"position 2 of q cannot be read: its topic {topic!r}" in done.stderr
            assert "names no loop-actors event class" in done.stderr


def test_a_foreign_aggregate_class_in_a_first_event_is_not_imported(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The aggregate class inside InvocationStarted is resolved when the invocation is built:
    a foreign one is refused before that (resume, history: exit 4), nothing imported."""
    set_originator_topic(folder / "e.db", "q", "tripwire:Event")
    for command in COMMANDS:
        done = run_in_process(
            *command, cwd=folder, db="sqlite:///e.db", capsys=capsys, monkeypatch=monkeypatch
        )
        assert not (folder / "imported.txt").exists(), command
        assert done.returncode != 1, (command, done.stderr)
        if command[0] in ("history", "resume"):
            assert done.returncode == 4, (command, done.stderr)
            assert "position 1 of q cannot be read: its originator_topic 'tripwire:Event'" in (
                done.stderr
            )


def test_the_reported_case_in_a_new_process_prints_no_zen(folder: Path) -> None:
    """The case as reported: ``history`` of a row whose topic is ``this:s``, in a new process."""
    set_topic(folder / "e.db", "q", 2, "this:s")
    done = run_cli("history", "q", cwd=folder, db="sqlite:///e.db")
    assert ZEN not in done.stdout + done.stderr
    assert done.returncode == 4, done.stderr


def test_the_api_raises_the_typed_error_naming_the_row(folder: Path) -> None:
    """``Runtime.history`` and ``Runtime.resume`` raise ``UnreadableEventError`` (an
    ``InconsistentHistoryError``) with the row's aggregate, position and topic."""
    set_topic(folder / "e.db", "q", 2, "tripwire:Event")

    async def read() -> None:
        with trio.fail_after(30):
            async with Runtime(f"sqlite:///{folder / 'e.db'}") as runtime:
                await runtime.history("q")

    with pytest.raises(UnreadableEventError) as raised:
        trio.run(read)
    assert (raised.value.invocation_id, raised.value.position) == ("q", 2)
    assert raised.value.topic == "tripwire:Event"
    assert not (folder / "imported.txt").exists()
