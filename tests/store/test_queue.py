"""The work queue on SQLite and on a real PostgreSQL server: claims, leases, epochs, holders.

Bad inputs tried: a claim of 0 rows or for no agent, a renewal and a release by a
holder whose lease was taken over, a stale epoch, an acquire of a live lease, a
batch naming one invocation twice.
Every test also runs on SQLite writing one statement a row (as on SQLite before
3.35, which has no ``RETURNING``).
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aggregates.lease import (
    DRAINED,
    HolderKind,
    HolderRow,
    QueueStatus,
    Refuse,
    Release,
    Take,
)
from loop_actors import Agent, Runtime, ScriptedModel
from loop_actors.store.queue import (
    CLAIM_AT_MOST,
    ROWS_PER_STATEMENT,
    Claimed,
    NewRow,
    PostgresQueue,
    QueueBusyError,
    SQLiteQueue,
    WorkQueue,
    libpq_url,
    url_connect_timeout,
)

MakeQueue = Callable[[], WorkQueue]


class RowByRowQueue(SQLiteQueue):
    """The SQLite queue as it writes on a SQLite without ``RETURNING``: a statement a row."""

    returning = False


@pytest.fixture(params=["sqlite", "sqlite-row-by-row", "postgresql"])
def make_queue(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeQueue]:
    """A factory of queue connections to one fresh database (each call: a new connection)."""
    opened: list[WorkQueue] = []
    if request.param.startswith("sqlite"):
        path = str(tmp_path / "queue.db")
        kind = SQLiteQueue if request.param == "sqlite" else RowByRowQueue

        def make() -> WorkQueue:
            queue = kind(path)
            opened.append(queue)
            return queue
    else:
        url = request.getfixturevalue("postgres_url")

        def make() -> WorkQueue:
            queue = PostgresQueue(url)
            opened.append(queue)
            return queue

    yield make
    for queue in opened:
        queue.close()


def never_gone(holder: HolderRow | None, now: float) -> bool:
    return False


def always_gone(holder: HolderRow | None, now: float) -> bool:
    return holder is not None


def test_claims_take_the_oldest_runnable_rows_of_the_served_agents_first(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    for number in range(5):
        assert queue.enqueue(f"inv-{number}", "payments")
    queue.enqueue("other-0", "another-agent")
    first = queue.claim(holder="w1", agent_names=["payments"], limit=2, lease_s=30)
    second = queue.claim(holder="w2", agent_names=["payments"], limit=10, lease_s=30)
    assert [c.invocation_id for c in first] == ["inv-0", "inv-1"]
    assert [c.invocation_id for c in second] == ["inv-2", "inv-3", "inv-4"]
    assert all(c.epoch == 1 and not c.record for c in first + second)
    assert queue.claim(holder="w3", agent_names=["payments"], limit=10, lease_s=30) == []
    row = queue.row("inv-0")
    assert row is not None
    assert (row.status, row.holder, row.epoch) == (QueueStatus.CLAIMED, "w1", 1)


def test_a_claim_of_nothing_or_for_no_agent_claims_nothing(make_queue: MakeQueue) -> None:
    queue = make_queue()
    queue.enqueue("inv-0", "payments")
    assert queue.claim(holder="w1", agent_names=["payments"], limit=0, lease_s=30) == []
    assert queue.claim(holder="w1", agent_names=[], limit=5, lease_s=30) == []
    assert not queue.enqueue("inv-0", "payments")  # a second enqueue adds nothing


def test_an_expired_lease_is_taken_over_with_the_next_epoch_and_fences_the_old_holder(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    queue.enqueue("inv-0", "payments")
    (old,) = queue.claim(holder="w1", agent_names=["payments"], limit=1, lease_s=1)
    # Not yet expired: nobody else can claim it.
    assert queue.claim(holder="w2", agent_names=["payments"], limit=1, lease_s=30) == []
    # Let it run out by renewing it to a lease that ended a second ago.
    assert queue.renew(holder="w1", leases=[("inv-0", old.epoch)], lease_s=-1) == {"inv-0"}
    (new,) = queue.claim(holder="w2", agent_names=["payments"], limit=1, lease_s=30)
    assert (new.epoch, new.record, new.taken_from) == (2, True, "w1")
    # The old holder can neither renew nor release any more; the new one can.
    assert queue.renew(holder="w1", leases=[("inv-0", old.epoch)], lease_s=30) == set()
    assert not queue.release("inv-0", holder="w1", epoch=old.epoch, release=DRAINED)
    assert not queue.release("inv-0", holder="w2", epoch=old.epoch, release=DRAINED)
    assert queue.release(
        "inv-0", holder="w2", epoch=new.epoch, release=Release(status=QueueStatus.ENDED)
    )
    row = queue.row("inv-0")
    assert row is not None
    assert (row.status, row.holder) == (QueueStatus.ENDED, None)


def test_acquiring_a_live_lease_is_refused_naming_its_holder_unless_taken_over(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    assert queue.enqueue_many([NewRow.held("inv-0", "payments", holder="run-a", lease_s=30)])[0]
    assert not queue.enqueue_many([NewRow.held("inv-0", "payments", holder="run-b", lease_s=30)])[0]
    refused = queue.acquire(
        "inv-0", "payments", holder="run-b", lease_s=30, take_over=False, gone=never_gone
    )
    assert isinstance(refused, Refuse)
    assert refused.holder == "run-a"
    assert refused.expires_at > queue.now() + 20
    taken = queue.acquire(
        "inv-0", "payments", holder="run-b", lease_s=30, take_over=True, gone=never_gone
    )
    assert taken == Take(epoch=1, record=True, taken_from="run-a")


def test_a_released_lease_is_taken_without_fencing_anyone(make_queue: MakeQueue) -> None:
    queue = make_queue()
    queue.enqueue_many([NewRow.held("inv-0", "payments", holder="run-a", lease_s=30)])
    queue.release("inv-0", holder="run-a", epoch=0, release=DRAINED)
    taken = queue.acquire(
        "inv-0", "payments", holder="run-b", lease_s=30, take_over=False, gone=never_gone
    )
    assert taken == Take(epoch=1, record=False)
    # An invocation with no row yet (its starter died first) is taken and recorded.
    unknown = queue.acquire(
        "inv-9", "payments", holder="run-b", lease_s=30, take_over=False, gone=never_gone
    )
    assert unknown == Take(epoch=1, record=True)


def test_a_paused_row_is_not_claimed_until_made_runnable(make_queue: MakeQueue) -> None:
    queue = make_queue()
    queue.enqueue("inv-0", "payments")
    (claim,) = queue.claim(holder="w1", agent_names=["payments"], limit=1, lease_s=30)
    queue.release(
        "inv-0", holder="w1", epoch=claim.epoch, release=Release(status=QueueStatus.PAUSED)
    )
    assert queue.claim(holder="w1", agent_names=["payments"], limit=1, lease_s=30) == []
    # Only from the named statuses: an ended row stays ended.
    assert not queue.set_status("inv-0", QueueStatus.RUNNABLE, only_from=[QueueStatus.ENDED])
    assert queue.set_status("inv-0", QueueStatus.RUNNABLE, only_from=[QueueStatus.PAUSED])
    (again,) = queue.claim(holder="w2", agent_names=["payments"], limit=1, lease_s=30)
    assert (again.epoch, again.record) == (2, False)


def _worker_row(holder: str) -> HolderRow:
    return HolderRow(
        holder=holder,
        kind=HolderKind.WORKER,
        host="h",
        machine="m",
        pid=1,
        started_at=0,
        heartbeat_at=0,
        lease_s=30,
        agents=["payments"],
        concurrency=4,
    )


def test_a_gone_holder_is_reaped_and_its_leases_claimable_at_once(make_queue: MakeQueue) -> None:
    queue = make_queue()
    queue.register(_worker_row("w-dead"))
    queue.enqueue("inv-0", "payments")
    queue.claim(holder="w-dead", agent_names=["payments"], limit=1, lease_s=300)
    assert queue.reap(never_gone) == []
    assert [h.holder for h in queue.holders()[0]] == ["w-dead"]
    assert queue.reap(always_gone) == ["w-dead"]
    assert queue.holders()[0] == []
    (taken,) = queue.claim(holder="w2", agent_names=["payments"], limit=1, lease_s=30)
    assert (taken.taken_from, taken.record) == ("w-dead", True)


def test_the_runs_of_a_gone_holder_are_claimed_before_an_older_backlog(
    make_queue: MakeQueue,
) -> None:
    """A dead worker's runs wait behind no queue of new ones (take over first)."""
    queue = make_queue()
    queue.enqueue("held-0", "payments")
    queue.enqueue("held-1", "payments")
    queue.register(_worker_row("w-dead"))
    dead = queue.claim(holder="w-dead", agent_names=["payments"], limit=2, lease_s=300)
    assert [c.invocation_id for c in dead] == ["held-0", "held-1"]
    # A backlog submitted before the holder is found gone: its leases expire now, after
    # every row of the backlog became due.
    backlog = [f"new-{n:02d}" for n in range(12)]
    for invocation_id in backlog:
        queue.enqueue(invocation_id, "payments")
    assert queue.reap(always_gone) == ["w-dead"]
    first = queue.claim(holder="w2", agent_names=["payments"], limit=3, lease_s=30)
    assert [(c.invocation_id, c.taken_from) for c in first] == [
        ("held-0", "w-dead"),
        ("held-1", "w-dead"),
        ("new-00", None),
    ]
    rest = queue.claim(holder="w2", agent_names=["payments"], limit=100, lease_s=30)
    assert [c.invocation_id for c in rest] == backlog[1:]


def test_a_reap_that_finds_nobody_gone_takes_no_write_transaction(
    make_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every heartbeat of every process reaps: when nobody is gone it must not take the
    write lock (on SQLite, the store's own, which each commit of every process waits for)."""
    queue = make_queue()
    holder = HolderRow(
        holder="w-1", kind=HolderKind.WORKER, host="h", machine="m", pid=1,
        started_at=0, heartbeat_at=0, lease_s=30, agents=["payments"],
    )  # fmt: skip
    queue.register(holder)
    writes: list[bool] = []
    transaction = type(queue)._transaction

    def watched(self: WorkQueue, *, write: bool = True, **options: Any) -> Any:
        writes.append(write)
        return transaction(self, write=write, **options)

    monkeypatch.setattr(type(queue), "_transaction", watched)
    assert queue.reap(never_gone) == []
    assert writes == [False]
    writes.clear()
    assert queue.reap(always_gone) == ["w-1"]
    assert writes == [False, True]  # looked, then written under the lock after looking again


def test_concurrent_claims_never_hand_one_row_to_two_holders(make_queue: MakeQueue) -> None:
    setup = make_queue()
    total = 120
    for number in range(total):
        setup.enqueue(f"inv-{number:03}", "payments")
    claims: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def claimer(name: str) -> None:
        queue = make_queue()  # a connection of its own, as a worker process has
        mine: list[str] = []
        try:
            while True:
                batch = queue.claim(holder=name, agent_names=["payments"], limit=3, lease_s=60)
                if not batch:
                    break
                mine += [c.invocation_id for c in batch]
        except BaseException as error:  # reported below
            errors.append(error)
        claims[name] = mine

    threads = [threading.Thread(target=claimer, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    every = [invocation for mine in claims.values() for invocation in mine]
    assert sorted(every) == [f"inv-{n:03}" for n in range(total)]
    assert len(set(every)) == total


MANY = ROWS_PER_STATEMENT * 2 + 5
"""More rows than two statements of a batch carry."""


def claim_many(queue: WorkQueue) -> list[Claimed]:
    """MANY new rows, all claimed by w1."""
    queue.enqueue_many([NewRow(f"inv-{n:04}", "payments") for n in range(MANY)])
    claimed = queue.claim(holder="w1", agent_names=["payments"], limit=MANY, lease_s=30)
    assert len(claimed) == MANY
    return claimed


def test_a_batch_of_new_rows_adds_only_those_missing_and_says_which(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    queue.enqueue("inv-0001", "payments")
    rows = [NewRow(f"inv-{n:04}", "payments", agent_ref="m:a") for n in range(MANY)]
    made = queue.enqueue_many([*rows, NewRow("inv-0002", "payments")])
    # inv-0001 existed; inv-0002 is named twice: only its first request added it.
    assert made == [n != 1 for n in range(MANY)] + [False]
    listed, _ = queue.rows()
    assert len(listed) == MANY
    row = queue.row("inv-0003")
    assert row is not None
    assert (row.status, row.agent_ref) == (QueueStatus.RUNNABLE, "m:a")


def test_a_batch_of_releases_gives_back_only_the_leases_still_held(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    claimed = claim_many(queue)
    ended, paused = Release(status=QueueStatus.ENDED), Release(status=QueueStatus.PAUSED)
    leases = [
        (c.invocation_id, c.epoch, paused if n % 3 == 0 else ended, "why" if n else None)
        for n, c in enumerate(claimed)
    ]
    stale = (claimed[0].invocation_id, claimed[0].epoch + 1, ended, None)
    # A stale epoch gives nothing back; the right one does.
    assert queue.release_many([stale], holder="w1") == set()
    assert queue.release_many(leases, holder="w1") == {c.invocation_id for c in claimed}
    assert queue.release_many(leases[:3], holder="w1") == set()  # no longer held
    assert queue.release_many(leases[:3], holder="w2") == set()  # never its leases
    for n, (invocation_id, _, release, _) in enumerate(leases):
        row = queue.row(invocation_id)
        assert row is not None
        assert (row.status, row.holder, row.note) == (release.status, None, "why" if n else None)


def test_renewing_many_leases_keeps_those_held_and_drops_one_taken_over(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    leases = [(c.invocation_id, c.epoch) for c in claim_many(queue)]
    assert queue.renew(holder="w1", leases=leases[:1], lease_s=-1) == {"inv-0000"}
    (taken,) = queue.claim(holder="w2", agent_names=["payments"], limit=1, lease_s=30)
    assert taken.invocation_id == "inv-0000"
    kept = queue.renew(holder="w1", leases=leases, lease_s=30)
    assert kept == {f"inv-{n:04}" for n in range(1, MANY)}
    row = queue.row("inv-0005")
    assert row is not None
    assert row.due_at > queue.now() + 20


def test_a_claim_with_room_for_everything_takes_at_most_claim_at_most_rows(
    make_queue: MakeQueue,
) -> None:
    """Bad input: room for more rows than one statement may name."""
    queue = make_queue()
    queue.enqueue_many([NewRow(f"inv-{n:05}", "payments") for n in range(CLAIM_AT_MOST + 5)])
    first = queue.claim(holder="w1", agent_names=["payments"], limit=100_000, lease_s=30)
    rest = queue.claim(holder="w1", agent_names=["payments"], limit=100_000, lease_s=30)
    assert (len(first), len(rest)) == (CLAIM_AT_MOST, 5)
    assert first[0].invocation_id == "inv-00000"


def test_the_runtime_s_own_url_options_are_not_handed_to_postgresql() -> None:
    url = (
        "postgresql://u:p@h:5432/db?lock_timeout=3&sslmode=require&lock_retry=1&mode=ro"
        "&pool_size=4&connect_timeout=2"
    )
    assert libpq_url(url) == "postgresql://u:p@h:5432/db?sslmode=require"
    assert libpq_url("postgresql://h/db") == "postgresql://h/db"
    assert url_connect_timeout(url, 5) == 2  # given to psycopg as its argument
    assert url_connect_timeout("postgresql://h/db", 5) == 5


def test_processes_racing_to_create_the_tables_all_succeed(make_queue: MakeQueue) -> None:
    """Bad input: eight connections whose first operation comes at the same moment."""
    queues = [make_queue() for _ in range(8)]
    start = threading.Barrier(len(queues))
    errors: list[BaseException] = []

    def first_use(queue: WorkQueue, number: int) -> None:
        start.wait()
        try:
            queue.enqueue(f"inv-{number}", "payments")
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=first_use, args=(q, n)) for n, q in enumerate(queues)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(queues[0].rows()[0]) == len(queues)


def test_new_rows_written_together_leave_a_row_that_exists_alone(make_queue: MakeQueue) -> None:
    queue = make_queue()
    assert queue.enqueue_many([NewRow.held("inv-1", "payments", holder="run-a", lease_s=30)])[0]
    made = queue.enqueue_many(
        [
            NewRow.held(i, "payments", holder="run-b", lease_s=30)
            for i in ("inv-0", "inv-1", "inv-2")
        ]
    )
    assert made == [True, False, True]
    rows = {i: queue.row(i) for i in ("inv-0", "inv-1", "inv-2")}
    assert {i: row.holder for i, row in rows.items() if row is not None} == {
        "inv-0": "run-b",
        "inv-1": "run-a",
        "inv-2": "run-b",
    }


def test_leases_released_together_release_only_those_still_held(make_queue: MakeQueue) -> None:
    queue = make_queue()
    queue.enqueue_many(
        [NewRow.held(i, "payments", holder="run-a", lease_s=30) for i in ("inv-0", "inv-1")]
    )
    ended = Release(status=QueueStatus.ENDED)
    released = queue.release_many(
        [("inv-0", 0, ended, None), ("inv-1", 7, ended, None), ("inv-9", 0, ended, None)],
        holder="run-a",
    )
    assert released == {"inv-0"}
    row0, row1 = queue.row("inv-0"), queue.row("inv-1")
    assert row0 is not None
    assert row1 is not None
    assert (row0.status, row0.holder) == (QueueStatus.ENDED, None)
    assert (row1.status, row1.holder) == (QueueStatus.CLAIMED, "run-a")


def test_a_runtime_on_a_postgresql_url_with_every_store_option_opens_its_queue(
    postgres_url: str,
) -> None:
    """``pool_size`` and ``connect_timeout`` are the store's: the queue's connection
    (libpq) must not be handed them, or it refuses the URL and no run can start."""
    url = f"{postgres_url}?pool_size=3&connect_timeout=4&lock_timeout=5"
    agent = Agent("plain", ScriptedModel([{"kind": "final", "answer": "ok"}]))
    outcome = Runtime(url).run_sync(agent, "answer", invocation_id="with-options")
    assert (outcome.reason, outcome.answer) == ("completed", "ok")


def test_rows_without_a_limit_are_every_row_past_the_default_ten_thousand(
    make_queue: MakeQueue,
) -> None:
    """`loop-actors list --status` reads every row (a capped read lost the oldest ones)."""
    queue = make_queue()
    queue.enqueue_many([NewRow(f"inv-{n:05}", "payments") for n in range(10_005)])
    capped, _ = queue.rows()
    every, _ = queue.rows(limit=None)
    assert (len(capped), len(every)) == (10_000, 10_005)
    assert {row.invocation_id for row in every} == {f"inv-{n:05}" for n in range(10_005)}


def test_a_release_is_committed_without_a_flush_an_enqueue_with_one(tmp_path: Path) -> None:
    """A release lost to a machine's crash (with what came after it) leaves the row as a crash
    just before it would: its holder gone, its lease running out. So a run does not wait for
    the flush of its release; an enqueue (what makes an invocation runnable) still does."""
    queue = SQLiteQueue(str(tmp_path / "queue.db"))
    statements: list[str] = []

    def seen() -> list[str]:
        found = [s for s in statements if "synchronous" in s or s in ("BEGIN IMMEDIATE", "COMMIT")]
        statements.clear()
        return found

    try:
        queue.enqueue_many([NewRow("inv-0", "payments")])  # the tables are made first
        [claimed] = queue.claim(holder="run-a", agent_names=["payments"], limit=1, lease_s=30)
        queue._connection.set_trace_callback(statements.append)
        queue.enqueue_many([NewRow("inv-1", "payments")])
        assert seen() == ["BEGIN IMMEDIATE", "COMMIT"]
        released = queue.release_many(
            [(claimed.invocation_id, claimed.epoch, DRAINED, None)], holder="run-a"
        )
        assert released == {"inv-0"}
        assert seen() == [
            "PRAGMA synchronous = 1",
            "BEGIN IMMEDIATE",
            "COMMIT",
            "PRAGMA synchronous = 2",
        ]
        queue._connection.set_trace_callback(None)
        assert queue._connection.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
    finally:
        queue.close()


def test_a_write_at_once_is_refused_when_it_would_wait_and_writes_nothing(tmp_path: Path) -> None:
    """Bad inputs: the database's lock held by another connection; the queue's own lock held
    by another thread; a queue on a shared in-memory connection. Each refusal writes nothing,
    and the queue's later writes wait for the lock as before."""
    path = tmp_path / "queue.db"
    queue = SQLiteQueue(str(path), timeout_s=5)
    try:
        queue.enqueue_many([NewRow("inv-0", "payments"), NewRow("inv-1", "payments")])
        [first] = queue.claim(holder="run-a", agent_names=["payments"], limit=1, lease_s=30)
        release = functools.partial(
            queue.release_many, [(first.invocation_id, first.epoch, DRAINED, None)], holder="run-a"
        )
        assert queue.writes_at_once
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process writes
        with pytest.raises(QueueBusyError):
            queue.at_once(release)
        row = queue.row(first.invocation_id)
        assert row is not None
        assert row.holder == "run-a"  # nothing written
        other.execute("COMMIT")
        other.close()
        taken = threading.Event()
        go = threading.Event()

        def hold_the_queue() -> None:
            with queue._lock:
                taken.set()
                go.wait(30)

        holder = threading.Thread(target=hold_the_queue)
        holder.start()
        assert taken.wait(30)
        with pytest.raises(QueueBusyError):
            queue.at_once(release)
        go.set()
        holder.join(30)
        assert queue.at_once(release) == {first.invocation_id}
        assert queue._connection.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    finally:
        queue.close()
    memory = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    shared = SQLiteQueue.sharing(memory, contextlib.nullcontext)
    assert not shared.writes_at_once
    with pytest.raises(QueueBusyError):
        shared.at_once(lambda: None)
    memory.close()
