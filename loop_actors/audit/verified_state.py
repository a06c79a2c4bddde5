"""The local "last verified" state of ``audit verify``, as an immudb client keeps its own.

After a verify that found nothing, the log's size and head (and the last checkpoint of
each checkpoint directory it checked) are saved in a small JSON file of the verifier's
own, by default ``$XDG_STATE_HOME/loop-actors/verified/<store id>.json``
(``~/.local/state/...`` when ``XDG_STATE_HOME`` is unset). The next verify of the same
store checks that the log still gives that head at that size (it only grew), and that
those checkpoints are still there, unchanged. A verify that finds something leaves the
file as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from aggregates.decisions import Frozen
from loop_actors.audit.checkpoint import CheckpointError, LogHead
from loop_actors.audit.checkpointer import DirectoryMark

STATE_HOME_ENV = "XDG_STATE_HOME"


class MarkRecord(Frozen):
    """A checkpoint directory's last checkpoint, as saved."""

    number: int
    sha256: str


class VerifiedState(Frozen):
    """What the last verify that found nothing saw."""

    store_id: str
    size: int
    head: str
    last_notification_id: int
    verified_at: datetime
    checkpoint_dirs: dict[str, MarkRecord] = {}
    """Absolute directory path -> its last checkpoint."""

    def mark(self, directory: Path) -> DirectoryMark | None:
        """The last checkpoint of ``directory`` the last verify saw, or None."""
        record = self.checkpoint_dirs.get(str(directory.absolute()))
        return None if record is None else DirectoryMark(record.number, record.sha256)


def default_state_path(store_id: str) -> Path:
    """``$XDG_STATE_HOME/loop-actors/verified/<store id>.json`` (``~/.local/state`` by default)."""
    base = os.environ.get(STATE_HOME_ENV) or str(Path.home() / ".local" / "state")
    return Path(base) / "loop-actors" / "verified" / f"{store_id}.json"


def load_state(path: Path, store_id: str) -> VerifiedState | None:
    """The saved state, or None when there is none yet.

    Raises:
        CheckpointError: the file cannot be read, is not a state file, or is of another store.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise CheckpointError(f"cannot read the last-verified state {path}: {error}") from error
    try:
        state = VerifiedState.model_validate_json(text)
    except ValidationError as error:
        raise CheckpointError(
            f"{path} is not a last-verified state file ({error.error_count()} problem(s))"
        ) from error
    if state.store_id != store_id:
        raise CheckpointError(f"{path} is the state of store {state.store_id}, not of {store_id}")
    return state


def save_state(path: Path, state: VerifiedState) -> None:
    """Replace the state file atomically (a temporary file, then a rename).

    Raises:
        OSError: it cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=".verified-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(state.model_dump_json(indent=2) + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def next_state(
    previous: VerifiedState | None,
    store_id: str,
    log: LogHead,
    marks: dict[Path, DirectoryMark | None],
) -> VerifiedState:
    """The state to save after a verify that found nothing."""
    dirs = dict(previous.checkpoint_dirs) if previous else {}
    for directory, mark in marks.items():
        if mark is not None:
            dirs[str(directory.absolute())] = MarkRecord(number=mark.number, sha256=mark.sha256)
    return VerifiedState(
        store_id=store_id,
        size=log.size,
        head=log.head,
        last_notification_id=log.last_id,
        verified_at=datetime.now(UTC),
        checkpoint_dirs=dirs,
    )
