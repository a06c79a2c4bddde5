"""A Runtime keeps its store open between ``run_sync`` calls, and leaves nothing behind.

``Runtime(url).run_sync(...)`` used to open and close the store, the Journal's thread,
the work queue and the holder's registration for every call. A runtime now opens them
at its first call and keeps them until ``close()``, the end of a ``with`` (or ``async
with``) block, its collection, or interpreter exit. What is kept is its process's own (a
forked child opens its own), serves one call at a time (a call from another thread
meanwhile is refused, typed), and holds no lease between calls.

Bad inputs tried: a ``run_sync`` from a second thread while the first runs (and a
``close()`` from it); ``close()`` from a tool of the runtime's own call; ``close()``
twice and on a runtime never opened; a runtime never closed when its process exits;
``os.fork()`` with the parent's runtime open, the child using the same object; a call
after ``close()``; a store that cannot be opened (twice, then it can).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.lease import QueueStatus
from loop_actors import (
    Agent,
    InvocationNotFoundError,
    ModelRequest,
    Runtime,
    RuntimeBusyError,
    ScriptedModel,
    StoreUnavailableError,
    TerminalReason,
    tool,
)
from loop_actors.runtime.leases import HolderRegistration
from loop_actors.store.queue import SQLiteQueue

WAIT_S = 30.0
"""The longest a test waits for another thread or process."""


@tool
async def note(key: str) -> str:
    """Return the key."""
    return key


def one_call(name: str, **arguments: Any) -> ScriptedModel:
    """A model that calls ``name`` once, then answers."""

    def decide(request: ModelRequest) -> dict[str, Any]:
        if not request.results:
            call = {"id": "c1", "name": name, "arguments": arguments}
            return {"kind": "tool_calls", "calls": [call]}
        return {"kind": "final", "answer": "done"}

    return ScriptedModel(decide)


AGENT = Agent("kept", one_call("note", key="k"), [note])


def journal_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "loop-actors-journal"]


def holders(path: Path) -> list[str]:
    """The holders registered in the store's work queue (read with a connection of its own)."""
    queue = SQLiteQueue(str(path), read_only=True)
    try:
        rows, _ = queue.holders()
    finally:
        queue.close()
    return [row.holder for row in rows]


def no_connection_open(path: Path) -> bool:
    """Whether no connection (of any process) has the SQLite file open.

    Leaving WAL mode needs the file to itself: it fails, "database is locked", while
    another connection is open.
    """
    connection = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        try:
            mode = connection.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
        except sqlite3.OperationalError:
            return False
        connection.execute("PRAGMA journal_mode=WAL")
        return bool(mode == "delete")
    finally:
        connection.close()


def run_python(script: str, *args: str) -> dict[str, Any]:
    """Run ``script`` in a new interpreter; what it printed last, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


# --------------------------------------------------------------------------- reuse


def test_run_sync_calls_of_one_runtime_share_one_store(db_url: str) -> None:
    """A memory:// store lives as long as its runtime: the second call sees the first's run."""
    runtime = Runtime("memory://")
    try:
        first = runtime.run_sync(AGENT, "one", invocation_id="first")
        second = runtime.run_sync(AGENT, "two", invocation_id="second")
        history = trio.run(runtime.history, "first")
    finally:
        runtime.close()
    assert (first.reason, second.reason) == (TerminalReason.COMPLETED, TerminalReason.COMPLETED)
    assert type(history[-1]).__name__ == "Terminated"


def test_the_journal_thread_is_started_once_and_stopped_at_close(tmp_path: Path) -> None:
    before = len(journal_threads())
    runtime = Runtime(f"sqlite:///{tmp_path / 'kept.db'}")
    for i in range(3):
        assert runtime.run_sync(AGENT, f"goal {i}").reason is TerminalReason.COMPLETED
        assert len(journal_threads()) == before + 1  # the same thread, kept between calls
    runtime.close()
    assert len(journal_threads()) == before


def test_close_leaves_no_thread_connection_or_registration(tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    runtime = Runtime(f"sqlite:///{path}")
    runtime.run_sync(AGENT, "goal")
    assert holders(path) == [runtime.holder_id]  # registered once, kept between calls
    assert not no_connection_open(path)
    runtime.close()
    runtime.close()  # a second close does nothing
    assert holders(path) == []
    assert no_connection_open(path)


def test_a_runtime_nobody_refers_to_any_more_closes_what_it_kept(tmp_path: Path) -> None:
    """``Runtime(url).run_sync(...)`` on a new object each time leaves nothing open."""
    path = tmp_path / "kept.db"
    for i in range(3):
        assert Runtime(f"sqlite:///{path}").run_sync(AGENT, f"goal {i}").reason is (
            TerminalReason.COMPLETED
        )
    assert holders(path) == []
    assert no_connection_open(path)


def test_a_runtime_opens_again_when_used_after_close(tmp_path: Path) -> None:
    runtime = Runtime(f"sqlite:///{tmp_path / 'kept.db'}")
    runtime.close()  # never opened: nothing to close
    runtime.run_sync(AGENT, "before", invocation_id="before")
    runtime.close()
    assert runtime.run_sync(AGENT, "after").reason is TerminalReason.COMPLETED
    assert len(trio.run(runtime.history, "before")) > 1
    runtime.close()


def test_a_with_block_closes_what_its_calls_kept_open(tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    with Runtime(f"sqlite:///{path}") as runtime:
        runtime.run_sync(AGENT, "one")
        runtime.run_sync(AGENT, "two")
        assert holders(path) == [runtime.holder_id]
    assert holders(path) == []
    assert no_connection_open(path)


def test_an_async_with_block_closes_what_earlier_calls_kept_open(tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    runtime = Runtime(f"sqlite:///{path}")
    runtime.run_sync(AGENT, "kept", invocation_id="kept")

    async def go() -> None:
        with trio.fail_after(WAIT_S):
            async with runtime:
                assert len(await runtime.history("kept")) > 1

    trio.run(go)
    assert holders(path) == []
    assert no_connection_open(path)


# --------------------------------------------------------------------------- leases


@tool(effect="write", requires_approval=True)
def pay(amount: int) -> str:
    """Pay an amount (a person approves first)."""
    return f"paid {amount}"


def payer() -> Agent:
    script: list[dict[str, Any]] = [
        {"kind": "tool_calls", "calls": [{"id": "p1", "name": "pay", "arguments": {"amount": 5}}]},
        {"kind": "final", "answer": "paid"},
    ]
    return Agent("payer", ScriptedModel(script), [pay])


def test_no_lease_is_held_between_calls(tmp_path: Path) -> None:
    """A run paused by a kept-open runtime: another runtime approves and resumes it at once."""
    path = tmp_path / "kept.db"
    url = f"sqlite:///{path}"
    kept = Runtime(url)
    try:
        paused = kept.run_sync(payer(), "pay", invocation_id="pay-1")
        assert paused.reason is TerminalReason.APPROVAL_REQUIRED
        queue = SQLiteQueue(str(path), read_only=True)
        try:
            row = queue.row("pay-1")
        finally:
            queue.close()
        assert row is not None
        assert (row.status, row.holder) == (QueueStatus.PAUSED, None)
        other = Runtime(url)

        async def approve_and_resume() -> TerminalReason:
            with trio.fail_after(WAIT_S):
                async with other:
                    assert paused.digest is not None
                    await other.approve("pay-1", digest=paused.digest, by="ops")
                    return (await other.resume("pay-1", payer())).reason  # no LeaseHeldError

        assert trio.run(approve_and_resume) is TerminalReason.COMPLETED
    finally:
        kept.close()


def test_a_registration_older_than_half_a_lease_is_written_again() -> None:
    """Between calls no heartbeat runs: the next call registers again before it looks gone."""
    registration = HolderRegistration("run:host:1:abc", registered=True, renewed_at=100.0)
    registration.expire_if_stale(30.0, now=114.9)
    assert registration.registered
    registration.expire_if_stale(30.0, now=115.1)
    assert not registration.registered


def test_a_call_after_an_idle_spell_renews_the_stale_registration_with_its_start(
    tmp_path: Path,
) -> None:
    """Idle for more than half a lease, the next run's start registers the holder again:
    while it runs, its registration is fresh (it used to keep the old heartbeat until
    the call's first beat, a third of a lease in, and look gone meanwhile)."""
    path = tmp_path / "kept.db"
    ages: list[float] = []

    @tool
    def heartbeat_age(key: str) -> str:
        """How old this process's registration is, as another process reads it."""
        queue = SQLiteQueue(str(path), read_only=True)
        try:
            rows, now = queue.holders()
        finally:
            queue.close()
        ages.extend(now - row.heartbeat_at for row in rows)
        return key

    kept = Runtime(f"sqlite:///{path}", lease_s=2)
    try:
        kept.run_sync(AGENT, "first", invocation_id="before-idle")
        time.sleep(1.3)  # more than half the lease, no call: no heartbeat
        agent = Agent("kept", one_call("heartbeat_age", key="k"), [heartbeat_age])
        assert kept.run_sync(agent, "again", invocation_id="after-idle").answer == "done"
    finally:
        kept.close()
    assert len(ages) == 1
    assert ages[0] < 1.0, ages


# --------------------------------------------------------------------------- threads


def in_a_thread(call: Any) -> object:
    """What ``call()`` returned or raised in a thread of its own (it must end within WAIT_S)."""
    result: list[object] = []

    def target() -> None:
        try:
            result.append(call())
        except Exception as error:
            result.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the call from a second thread did not return"
    return result[0]


def test_a_run_sync_from_another_thread_while_one_runs_is_refused(tmp_path: Path) -> None:
    """Refused with RuntimeBusyError, nothing recorded; the runtime serves it once free."""
    reached, release = threading.Event(), threading.Event()

    @tool
    def wait_here() -> str:
        """Wait until the test lets the run go on."""
        reached.set()
        assert release.wait(WAIT_S)
        return "went on"

    agent = Agent("waiter", one_call("wait_here"), [wait_here])
    runtime = Runtime(f"sqlite:///{tmp_path / 'kept.db'}")
    outcomes: list[Any] = []
    first = threading.Thread(
        target=lambda: outcomes.append(runtime.run_sync(agent, "first", invocation_id="first")),
        name="first-caller",
    )
    first.start()
    try:
        assert reached.wait(WAIT_S)
        second = in_a_thread(lambda: runtime.run_sync(AGENT, "second", invocation_id="second"))
        closing = in_a_thread(runtime.close)
        for refused in (second, closing):
            assert isinstance(refused, RuntimeBusyError), refused
            assert refused.thread == "first-caller"
            assert "one call at a time" in str(refused)
    finally:
        release.set()
        first.join(WAIT_S)
    assert [o.reason for o in outcomes] == [TerminalReason.COMPLETED]
    with pytest.raises(InvocationNotFoundError):
        trio.run(runtime.history, "second")  # the refused call recorded nothing
    assert runtime.run_sync(AGENT, "second", invocation_id="second").reason is (
        TerminalReason.COMPLETED
    )
    runtime.close()


# --------------------------------------------------------------------------- processes


def test_a_runtime_left_open_is_closed_at_interpreter_exit(tmp_path: Path) -> None:
    """Its process exits normally without close(): nothing is left registered or open."""
    path = tmp_path / "kept.db"
    found = run_python(
        """
        import json, sys
        from tests.runtime.test_runtime_kept_open_between_calls import AGENT
        from loop_actors import Runtime
        runtime = Runtime(f"sqlite:///{sys.argv[1]}")
        runtime.run_sync(AGENT, "one")
        runtime.run_sync(AGENT, "two")
        print(json.dumps({"holder": runtime.holder_id}))
        """,
        str(path),
    )
    assert found["holder"].startswith("run:")
    assert holders(path) == []
    assert no_connection_open(path)


def test_a_forked_child_opens_its_own_store_and_leaves_its_parents_alone(tmp_path: Path) -> None:
    """The child's calls use connections and a holder of its own; the parent's still work."""
    path = tmp_path / "kept.db"
    found = run_python(
        """
        import json, os, sys
        from tests.runtime.test_runtime_kept_open_between_calls import AGENT, holders
        from loop_actors import Runtime
        path = sys.argv[1]
        runtime = Runtime(f"sqlite:///{path}")
        runtime.run_sync(AGENT, "parent before")
        parent_holder = runtime.holder_id
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read)
            outcome = runtime.run_sync(AGENT, "child")
            seen = {"reason": outcome.reason.value, "holder": runtime.holder_id,
                    "holders": holders(path), "pid": os.getpid()}
            os.write(write, json.dumps(seen).encode())
            os.close(write)
            sys.exit(0)  # a normal exit: the child's finalizer runs, on its own resources
        os.close(write)
        with os.fdopen(read) as pipe:
            child_saw = json.loads(pipe.read())
        _, status = os.waitpid(child, 0)
        after = runtime.run_sync(AGENT, "parent after")
        print(json.dumps({
            "child": child_saw, "status": status, "child_pid": child,
            "parent_holder": parent_holder, "holders_after_child": holders(path),
            "parent_after": after.reason.value, "parent_holder_now": runtime.holder_id,
        }))
        runtime.close()
        """,
        str(path),
    )
    child = found["child"]
    assert found["status"] == 0
    assert child["reason"] == "completed"
    # The child registered a holder of its own, named after its own process.
    assert child["holder"] != found["parent_holder"]
    assert f":{found['child_pid']}:" in child["holder"]
    assert set(child["holders"]) == {found["parent_holder"], child["holder"]}
    # Its exit closed its own: the parent's registration and connections are untouched.
    assert found["holders_after_child"] == [found["parent_holder"]]
    assert found["parent_after"] == "completed"
    assert found["parent_holder_now"] == found["parent_holder"]
    assert holders(path) == []
    assert no_connection_open(path)


def test_closing_from_inside_a_call_is_refused_and_the_call_goes_on(tmp_path: Path) -> None:
    """Bad input: a tool that closes the runtime running it."""
    runtime = Runtime(f"sqlite:///{tmp_path / 'kept.db'}")
    refused: list[BaseException] = []

    @tool
    async def close_it() -> str:
        """Close the runtime that runs this call."""
        try:
            runtime.close()
        except RuntimeBusyError as error:
            refused.append(error)
        return "tried"

    outcome = runtime.run_sync(Agent("closer", one_call("close_it"), [close_it]), "close")
    assert outcome.reason is TerminalReason.COMPLETED
    assert [type(error) for error in refused] == [RuntimeBusyError]
    runtime.close()


def test_a_store_that_cannot_be_opened_keeps_nothing_and_is_tried_again(tmp_path: Path) -> None:
    """Bad input: a SQLite file in a folder that does not exist (then made)."""
    folder = tmp_path / "later"
    runtime = Runtime(f"sqlite:///{folder / 'kept.db'}")
    for _ in range(2):
        with pytest.raises(StoreUnavailableError, match="does not exist"):
            runtime.run_sync(AGENT, "goal")
    folder.mkdir()
    assert runtime.run_sync(AGENT, "goal").reason is TerminalReason.COMPLETED
    runtime.close()
    assert no_connection_open(folder / "kept.db")
