"""Checkpoints the Runtime writes by itself, to a directory outside the store, in a chain.

A checkpoint directory holds ``checkpoint-000000000001.txt``, ``-2``, ... : each a
checkpoint note (:mod:`loop_actors.audit.checkpoint`) of the whole log, with two extension
lines, ``notification <id>`` (the notification id of its last row) and ``previous
<hex>`` (the SHA-256 of the whole file before it; 64 zeros for the first). Removing or
editing a checkpoint therefore breaks the chain at the next one, which ``audit verify
--checkpoint-dir`` reports.

The Runtime's :class:`Checkpointer` writes one after each commit that ends a run
(``Terminated``, or ``Paused``), after every ``every`` commits otherwise, and when the
runtime closes, if rows were written since the last one. It works on a thread of its
own: the Journal's thread only counts commits and wakes it, the trio thread never
waits for it. A checkpoint is written to a temporary file in the directory, flushed
to disk, then linked to its numbered name (a link never replaces a file: two
processes that race for a number both see it, and the loser takes the next one), and
the directory is flushed. A failure to write one is logged (at most once a minute for
the same error) and retried at the next trigger; it never fails a run.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from aggregates.events import DomainEvent
from aggregates.invocation import Paused, Terminated
from aggregates.log_chain import GENESIS, leaf, next_link
from loop_actors._errors import UsageError
from loop_actors._logs import BackgroundLoop, fields, package_logger
from loop_actors.audit.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointReport,
    Commitment,
    SigningKey,
    Verdict,
    VerifierKey,
    check_signature,
    checkpoint_note,
    load_signing_key,
    parse_note,
)
from loop_actors.store.store import EventStore

log = package_logger(__name__)

CHECKPOINT_DIR_ENV = "LOOP_ACTORS_CHECKPOINT_DIR"
CHECKPOINT_KEY_ENV = "LOOP_ACTORS_CHECKPOINT_KEY"
CHECKPOINT_EVERY_ENV = "LOOP_ACTORS_CHECKPOINT_EVERY"

DEFAULT_CHECKPOINT_EVERY = 100
"""Commits between two checkpoints when no run ends in between."""

FIRST_PREVIOUS = GENESIS
"""The ``previous`` of a directory's first checkpoint."""

_NAME = re.compile(r"checkpoint-(\d+)\.txt")

_LOG_REPEAT_S = 60.0
"""The same failure is logged at most this often."""


def checkpoint_file_name(number: int) -> str:
    """The name of a directory's checkpoint number ``number`` (1, 2, ...)."""
    return f"checkpoint-{number:012d}.txt"


@dataclass(frozen=True)
class CheckpointSettings:
    """Where and how a Runtime writes checkpoints (resolved from arguments and environment)."""

    directory: Path
    key_file: Path | None = None
    every: int = DEFAULT_CHECKPOINT_EVERY

    @classmethod
    def resolve(
        cls,
        directory: str | os.PathLike[str] | None,
        key_file: str | os.PathLike[str] | None,
        every: int | None,
    ) -> CheckpointSettings | None:
        """The settings from the arguments, else ``$LOOP_ACTORS_CHECKPOINT_*``; None: none.

        Raises:
            UsageError: ``every`` (or its variable) is not a whole number of at least 1,
                or a key or ``every`` is given without a directory.
        """
        folder = directory if directory is not None else os.environ.get(CHECKPOINT_DIR_ENV)
        key = key_file if key_file is not None else os.environ.get(CHECKPOINT_KEY_ENV)
        count: object = every
        if count is None:
            count = os.environ.get(CHECKPOINT_EVERY_ENV)
        if not folder:
            if directory is not None or key_file is not None or every is not None:
                raise UsageError("a checkpoint key or interval needs a checkpoint directory")
            return None
        if count is None or count == "":
            count = DEFAULT_CHECKPOINT_EVERY
        if isinstance(count, str):
            if not count.strip().isdigit():
                raise UsageError(f"{CHECKPOINT_EVERY_ENV} must be a whole number, got {count!r}")
            count = int(count)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise UsageError(
                f"checkpoint_every must be a whole number of at least 1, got {count!r}"
            )
        return cls(Path(folder), Path(key) if key else None, count)


class CheckpointDirectory:
    """A directory of numbered, chained checkpoint notes.

    A writer lists the directory once: after that, each checkpoint it writes follows
    the one it wrote last (its number plus one, the hash of the bytes it wrote), and
    the directory is listed again only when another writer took that number. A
    directory of 100,000 checkpoints costs no listing, and no match of 100,000 names,
    per checkpoint.
    """

    def __init__(self, path: Path) -> None:
        """Name the directory (no I/O)."""
        self.path = path
        self._last_written: tuple[int, bytes, Checkpoint | None] | None = None
        """The checkpoint this object wrote last (number, bytes, note), while it is the last."""

    def numbered(self) -> list[tuple[int, Path]]:
        """Every checkpoint file, by number (other files are ignored).

        Raises:
            CheckpointError: the directory cannot be read.
        """
        try:
            names = os.listdir(self.path)
        except OSError as error:
            raise CheckpointError(
                f"cannot read the checkpoint directory {self.path}: {error}"
            ) from error
        matches = [(_NAME.fullmatch(name), name) for name in names]
        return sorted((int(m.group(1)), self.path / name) for m, name in matches if m)

    def latest(self) -> tuple[int, bytes, Checkpoint | None] | None:
        """The last checkpoint: its number, file bytes and note; None when there is none.

        The note is None when the file is not a checkpoint note (it was damaged or
        edited): the next checkpoint still names its bytes, and ``audit verify``
        reports it; a writer logs it and goes on.

        Raises:
            CheckpointError: it cannot be read.
        """
        files = self.numbered()
        if not files:
            return None
        number, path = files[-1]
        data = _read_bytes(path)
        try:
            return number, data, _parse(data, path)
        except CheckpointError as error:
            log.warning(
                "the last checkpoint is not a checkpoint note (%s); writing after it", error
            )
            return number, data, None

    def write_next(
        self, make: Callable[[Checkpoint | None, str], str | None], *, attempts: int = 20
    ) -> Path | None:
        """Write the next checkpoint: ``make(latest, its file's hash)`` gives its note.

        ``make`` returns None when there is nothing to write (the latest covers it all).

        Raises:
            CheckpointError: it cannot be written, or the latest cannot be read.
        """
        for _ in range(attempts):
            latest = self._last_written or self.latest()
            number = 1 if latest is None else latest[0] + 1
            previous = FIRST_PREVIOUS if latest is None else hashlib.sha256(latest[1]).hexdigest()
            note = make(None if latest is None else latest[2], previous)
            if note is None:
                return None
            target = self.path / checkpoint_file_name(number)
            data = note.encode()
            if _write_new(self.path, target, data):
                try:
                    self._last_written = (number, data, _parse(data, target))
                except CheckpointError:  # pragma: no cover - a note just made always parses
                    self._last_written = None
                return target
            self._last_written = None  # another writer took the number: list the directory
        raise CheckpointError(
            f"cannot write a checkpoint in {self.path}: other writers took the next number "
            f"{attempts} times"
        )


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"cannot read {path}: {error}") from error


def _parse(data: bytes, path: Path) -> Checkpoint:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{path} is not UTF-8 text: {error}") from error
    return parse_note(text, path)


def _write_new(folder: Path, target: Path, data: bytes) -> bool:
    """Write ``target`` atomically, never replacing it; False when it exists already.

    Raises:
        CheckpointError: the file cannot be written.
    """
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=".checkpoint-", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            try:
                os.link(temporary, target)
            except FileExistsError:
                return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as error:
        raise CheckpointError(f"cannot write {target}: {error}") from error
    return True


def _ends_a_run(groups: Sequence[Sequence[DomainEvent]]) -> bool:
    return any(isinstance(event, Terminated | Paused) for group in groups for event in group)


class Checkpointer:
    """Writes the store's checkpoints to a directory, on a thread of its own.

    ``note_commits`` is called by the Journal's thread after each transaction; it
    counts and, when a checkpoint is due, wakes this thread. ``close`` writes a last
    one (when rows were written since) and stops the thread.
    """

    def __init__(self, store: EventStore, settings: CheckpointSettings) -> None:
        """Check the directory and key (blocking); :meth:`start` starts the thread.

        Raises:
            CheckpointError: the key file cannot be read, the directory cannot be made
                or read, or it holds checkpoints of another store.
        """
        self._store = store
        self.settings = settings
        self.directory = CheckpointDirectory(settings.directory)
        self._key: SigningKey | None = (
            load_signing_key(settings.key_file) if settings.key_file else None
        )
        self._origin = f"loop-actors/{store.store_id}"
        try:
            settings.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CheckpointError(
                f"cannot make the checkpoint directory {settings.directory}: {error}"
            ) from error
        latest = self.directory.latest()
        note = None if latest is None else latest[2]
        if note is not None and note.origin != self._origin:
            raise CheckpointError(
                f"{settings.directory} holds checkpoints of {note.origin}, not of this "
                f"store ({self._origin}): give each store a directory of its own"
            )
        # The log as chained so far (read lazily, on the thread).
        self._size = 0
        self._head = GENESIS
        self._last_id = 0
        self._started = False
        self._written_size: int | None = None
        self._condition = threading.Condition()
        self._commits = 0
        self._due = False
        self._stopping = False
        self._last_failure: tuple[str, float] | None = None
        self.written: list[Path] = []
        """The checkpoints this checkpointer wrote, in order."""
        self._thread = threading.Thread(
            target=self._work, name="loop-actors-checkpointer", daemon=True
        )

    def start(self) -> None:
        """Start the thread that writes checkpoints when :meth:`note_commits` says so."""
        self._thread.start()

    # ----------------------------------------------------------------- other threads

    def note_commits(self, groups: Sequence[Sequence[DomainEvent]]) -> None:
        """Count committed transactions; wake the thread when a checkpoint is due.

        Blocking: only for a lock held for a few instructions (the Journal's thread).
        """
        with self._condition:
            self._commits += len(groups)
            if self._commits >= self.settings.every or _ends_a_run(groups):
                self._commits = 0
                self._due = True
                self._condition.notify()

    def close(self) -> None:
        """Write a last checkpoint if rows were written since the last, and stop (blocking)."""
        if not self._thread.is_alive():
            return
        with self._condition:
            self._stopping = True
            self._due = True
            self._condition.notify()
        self._thread.join()

    # ----------------------------------------------------------------- the thread

    def _work(self) -> None:
        while True:
            with self._condition:
                while not self._due:
                    self._condition.wait()
                self._due = False
                stopping = self._stopping
            self._write_logged()
            if stopping:
                return

    def _write_logged(self) -> None:
        try:
            self.write()
        except Exception as error:  # a checkpoint never fails a run: logged, tried again later
            message = f"{type(error).__name__}: {error}"
            now = time.monotonic()
            last = self._last_failure
            if last is None or last[0] != message or now - last[1] >= _LOG_REPEAT_S:
                log.warning(
                    "could not write a checkpoint to %s (%s); the next commit that ends a "
                    "run tries again",
                    self.settings.directory,
                    message,
                    extra=fields(loop=BackgroundLoop.CHECKPOINTS, error_type=type(error).__name__),
                )
                self._last_failure = (message, now)
        else:
            self._last_failure = None

    def write(self) -> Path | None:
        """Extend the log chain to the store's end and write a checkpoint of it (blocking).

        Returns the file written, or None when the last checkpoint covers every row.

        Raises:
            CheckpointError: it cannot be written.
            eventsourcing.persistence.PersistenceError: the store cannot be read.
        """
        if not self._started:
            self._start_from_directory()
        for notification_id, originator_id, version, topic, state in self._store.log_rows(
            after=self._last_id
        ):
            self._head = next_link(
                self._head, leaf(notification_id, originator_id, version, topic, state)
            )
            self._size += 1
            self._last_id = notification_id
        if self._size in (0, self._written_size):
            return None
        size, head, last_id = self._size, self._head, self._last_id

        def make(latest: Checkpoint | None, previous: str) -> str | None:
            if latest is not None and latest.size >= size:
                return None  # another writer's checkpoint already covers these rows
            extensions = [f"notification {last_id}", f"previous {previous}"]
            return checkpoint_note(self._origin, size, head, self._key, extensions=extensions)

        written = self.directory.write_next(make)
        self._written_size = size
        if written is not None:
            self.written.append(written)
        return written

    def _start_from_directory(self) -> None:
        """Continue the chain from the directory's last checkpoint, when it says where it ends.

        Its head is not checked against the store here (that is ``audit verify``'s
        work): a checkpoint that continues a chain the store no longer gives does not
        verify either.
        """
        latest = self.directory.latest()
        self._started = True
        if latest is None:
            return
        checkpoint = latest[2]
        if checkpoint is None or checkpoint.notification_id is None:
            return  # not a note, or one without its row's id: chain the log from its start
        self._size = self._written_size = checkpoint.size
        self._head = checkpoint.head
        self._last_id = checkpoint.notification_id


def open_checkpointer(store: EventStore, settings: CheckpointSettings) -> Checkpointer:
    """A started :class:`Checkpointer` (blocking; see its constructor)."""
    checkpointer = Checkpointer(store, settings)
    checkpointer.start()
    return checkpointer


@dataclass(frozen=True)
class DirectoryMark:
    """The last checkpoint of a directory that a verify found good: its number and file hash."""

    number: int
    sha256: str


def _chain_finding(
    verdict: Verdict, directory: Path, number: int, problem: str
) -> CheckpointReport:
    return CheckpointReport(
        kind="checkpoint_chain",
        verdict=verdict,
        source=str(directory),
        store_size=0,
        position=number,
        problem=problem,
    )


def verify_directory(
    directory: Path, key: VerifierKey | None, mark: DirectoryMark | None
) -> tuple[list[CheckpointReport], list[Commitment], DirectoryMark | None]:
    """Check a checkpoint directory's chain; give its checkpoints as commitments for the log.

    Findings (``checkpoint_chain``): a number missing between two present ones, a file
    that is not the one the next names (``previous``), an unreadable file
    (``checkpoint_edited``), a directory that ends before, or whose checkpoint differs
    from, the one the last verify saw (``mark``), an empty directory; with ``key``, a
    checkpoint without a valid signature by it (``kind`` ``checkpoint``). Checkpoints
    numbered below the first present one are taken as archived, not as a finding.

    Returns the findings, the commitments of the readable, correctly signed
    checkpoints, and the mark of the directory's last checkpoint (None when empty).

    Raises:
        CheckpointError: the directory cannot be read.
    """
    files = CheckpointDirectory(directory).numbered()
    findings: list[CheckpointReport] = []
    commitments: list[Commitment] = []
    if not files:
        findings.append(
            _chain_finding(
                Verdict.CHECKPOINT_MISSING,
                directory,
                mark.number if mark else 1,
                "the directory holds no checkpoint"
                + (f" (the last verify saw number {mark.number})" if mark else ""),
            )
        )
        return findings, commitments, None
    hashes: dict[int, str] = {}
    previous_of: dict[int, str | None] = {}
    for number, path in files:
        try:
            data = _read_bytes(path)
            checkpoint = _parse(data, path)
        except CheckpointError as error:
            findings.append(
                _chain_finding(Verdict.CHECKPOINT_EDITED, directory, number, str(error))
            )
            continue
        hashes[number] = hashlib.sha256(data).hexdigest()
        previous_of[number] = checkpoint.previous
        signed, bad = check_signature(checkpoint, key, str(path))
        if bad is not None:
            findings.append(bad.model_copy(update={"position": number}))
            continue
        commitments.append(
            Commitment(str(path), checkpoint.origin, checkpoint.size, checkpoint.head, signed)
        )
    numbers = [number for number, _ in files]
    for before, number in itertools.pairwise(numbers):
        if number != before + 1:
            findings.append(
                _chain_finding(
                    Verdict.CHECKPOINT_MISSING,
                    directory,
                    before + 1,
                    f"checkpoint {before + 1}"
                    + (f" to {number - 1} are" if number - 1 > before + 1 else " is")
                    + f" missing (removed): {checkpoint_file_name(number)} follows "
                    f"{checkpoint_file_name(before)}",
                )
            )
        elif number in previous_of and before in hashes and previous_of[number] != hashes[before]:
            findings.append(
                _chain_finding(
                    Verdict.CHECKPOINT_EDITED,
                    directory,
                    before,
                    f"{checkpoint_file_name(before)} is not the checkpoint that "
                    f"{checkpoint_file_name(number)} names as its previous (edited or replaced)",
                )
            )
    last = numbers[-1]
    if mark is not None:
        if mark.number > last:
            findings.append(
                _chain_finding(
                    Verdict.CHECKPOINT_MISSING,
                    directory,
                    last + 1,
                    f"the last verify saw checkpoint {mark.number}; the directory ends at {last} "
                    "(checkpoints removed from its end)",
                )
            )
        elif mark.number in hashes and hashes[mark.number] != mark.sha256:
            findings.append(
                _chain_finding(
                    Verdict.CHECKPOINT_EDITED,
                    directory,
                    mark.number,
                    f"{checkpoint_file_name(mark.number)} is not the checkpoint the last verify "
                    "saw (edited or replaced)",
                )
            )
    latest = DirectoryMark(last, hashes[last]) if last in hashes else None
    return findings, commitments, latest
