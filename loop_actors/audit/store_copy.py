"""Copying a store into another (``loop-actors store copy``): SQLite to PostgreSQL, and back.

Every row of the source's log is written to the target as it was stored (its
bytes unchanged: an encrypted store stays encrypted with the same key), with its
notification id, in notification order, so the copy's log is the source's: the
same audit chain, the same checkpoint head, and the same store identity (a
checkpoint of the source verifies against the copy). Snapshot rows are copied
too, and the sealed secrets that paused invocations still need (still sealed: the
copy needs the same cipher key). The copy is then checked: its log head must
equal the source's, and the audit of every chain must find nothing broken.

The target must be empty, or hold the first rows of this same source (a copy
that was interrupted): the copy then goes on after them.
"""

from __future__ import annotations

from collections.abc import Callable

from aggregates.decisions import Frozen
from aggregates.log_chain import GENESIS
from loop_actors._errors import UsageError
from loop_actors.audit.checkpoint import log_head, log_links
from loop_actors.audit.verify import verify_all
from loop_actors.store.store import EventStore
from loop_actors.store.url import StoreUrl

COPY_PAGE = 500
"""Rows written per transaction."""


class StoreCopyError(UsageError):
    """Raised when a store cannot be copied as asked: nothing was written to the target."""


class CopyReport(Frozen):
    """What ``store copy`` did, and what it found when it checked the copy."""

    source: str
    """The source's URL, without its password."""
    target: str
    """The target's URL, without its password."""
    store_id: str | None
    """The identity both stores now have."""
    copied: int
    """Event rows written by this copy."""
    already: int
    """Event rows the target held before (an interrupted copy of the same source)."""
    snapshots: int
    """Snapshot rows written."""
    secrets: int = 0
    """Sealed secrets of paused invocations written (they stay sealed with the same key)."""
    size: int
    """Rows in the target's log afterwards."""
    head: str
    """The target's log head afterwards (as ``audit checkpoint`` computes it)."""
    same_as_source: bool
    """The target's log size and head equal the source's."""
    intact: int
    broken: int
    """Chains the audit of the target found intact / broken."""

    @property
    def ok(self) -> bool:
        """The copy equals its source and its audit found nothing broken."""
        return self.same_as_source and self.broken == 0


def copy_store(
    source_url: str,
    target_url: str,
    *,
    page: int = COPY_PAGE,
    progress: Callable[[int], None] | None = None,
) -> CopyReport:
    """Copy every row of one store into another, then check the copy (blocking).

    ``progress`` is told the number of rows copied so far after each transaction.

    Raises:
        StoreCopyError: the two URLs name one store, or the target holds rows
            that are not the first rows of this source.
        StoreUnavailableError: either store cannot be opened.
    """
    if _same_store(StoreUrl.parse(source_url), StoreUrl.parse(target_url)):
        raise StoreCopyError("--from and --to name the same store")
    source = EventStore(source_url, create=False, read_only=True)
    try:
        target = EventStore(target_url)
        try:
            return _copy(source, target, page=page, progress=progress)
        finally:
            target.close()
    finally:
        source.close()


def _same_store(one: StoreUrl, other: StoreUrl) -> bool:
    if one.kind != other.kind or one.kind == "memory":
        return False
    if one.kind == "sqlite":
        assert one.path is not None
        assert other.path is not None
        return one.path.resolve() == other.path.resolve()
    return (one.host, one.port, one.dbname) == (other.host, other.port, other.dbname)


def _copy(
    source: EventStore,
    target: EventStore,
    *,
    page: int,
    progress: Callable[[int], None] | None,
) -> CopyReport:
    already, last_id = _rows_already_there(source, target)
    if already == 0 and source.store_id is not None:
        target.adopt_identity(source.store_id)
    copied = 0
    batch: list[tuple[int, str, int, str, bytes]] = []
    for row in source.log_rows(page, after=last_id):  # an interrupted copy goes on from there
        batch.append(row)
        if len(batch) == page:
            target.copy_in(batch)
            copied += len(batch)
            batch = []
            if progress is not None:
                progress(already + copied)
    if batch:
        target.copy_in(batch)
        copied += len(batch)
        if progress is not None:
            progress(already + copied)
    snapshots = source.snapshot_rows()
    if not target.snapshot_rows():
        target.copy_snapshots_in(snapshots)
    secrets = source.sealed_rows()
    if secrets:
        table = target.sealed_table()
        try:
            table.upsert(secrets)
        finally:
            table.close()
    source_size, source_head = log_head(source)
    size, head = log_head(target)
    reports, _ = verify_all(target)
    broken = sum(1 for report in reports if not report.intact)
    return CopyReport(
        source=source.url.display,
        target=target.url.display,
        store_id=target.store_id,
        copied=copied,
        already=already,
        snapshots=len(snapshots),
        secrets=len(secrets),
        size=size,
        head=head,
        same_as_source=(size, head) == (source_size, source_head),
        intact=len(reports) - broken,
        broken=broken,
    )


def _rows_already_there(source: EventStore, target: EventStore) -> tuple[int, int]:
    """(rows, last notification id) the target holds of this source: (0, 0) when empty.

    Raises:
        StoreCopyError: the target holds rows that are not the source's first rows.
    """
    size, head = log_head(target)
    if size == 0:
        if target.snapshot_rows():
            raise StoreCopyError(f"{target.url.display} holds snapshots but no events: not empty")
        return 0, 0
    refusal = (
        f"{target.url.display} already holds {size} rows that are not the first rows of "
        f"{source.url.display}: a store is copied only into an empty one"
    )
    if target.store_id != source.store_id:
        raise StoreCopyError(refusal)
    link, last_id, seen = GENESIS, 0, 0
    for notification_id, current in log_links(source.log_rows()):
        seen += 1
        link, last_id = current, notification_id
        if seen == size:
            break
    if seen != size or link != head:
        raise StoreCopyError(refusal)
    return size, last_id
