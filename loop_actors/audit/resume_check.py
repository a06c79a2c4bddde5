"""Before a resume drives an invocation: check it against the checkpoints it was given.

A runtime given a checkpoint directory (``checkpoint_dir``, ``--checkpoint-dir``)
writes checkpoints of the store's log there; a resume by that runtime first checks
what it is about to continue against them, as ``loop-actors audit verify ID
--checkpoint-dir DIR`` does: the hash chains of the invocation and of every invocation
under it, the directory's own chain of checkpoints (and their signatures, when the
runtime signs with a key), and the log against every checkpoint of the directory. A
finding refuses the resume (``InconsistentHistoryError``, exit 4): nothing runs.

The log's check reads the whole log, once per runtime and checkpoint: a later resume
by the same runtime, while the directory's newest checkpoint is the one already
checked, reads the invocation's chains only.
"""

from __future__ import annotations

from dataclasses import dataclass

from loop_actors._errors import InconsistentHistoryError
from loop_actors.audit.checkpoint import CheckpointReport, load_signing_key, verify_log
from loop_actors.audit.checkpointer import (
    CheckpointDirectory,
    CheckpointSettings,
    verify_directory,
)
from loop_actors.audit.verify import verify_tree
from loop_actors.store.store import EventStore


@dataclass(frozen=True)
class CheckedLog:
    """The newest checkpoint the log was found to agree with: its size and head."""

    size: int
    head: str


def check_before_resume(
    store: EventStore,
    invocation_id: str,
    settings: CheckpointSettings,
    checked: CheckedLog | None,
) -> CheckedLog | None:
    """Check ``invocation_id`` against the checkpoints of ``settings`` (blocking; reads only).

    ``checked``: what an earlier call of this runtime found the log to agree with.
    Returns what the log agrees with now (None while the directory holds no
    checkpoint yet: there is nothing to check the log against).

    Raises:
        InvocationNotFoundError: no such invocation.
        InconsistentHistoryError: a chain of the invocation's tree is broken; the
            directory's chain of checkpoints is broken (one removed or edited, one not
            signed by the runtime's key); or the log does not give a checkpoint's head
            (rows edited, deleted, reordered, the log truncated or of another store).
        CheckpointError: the directory or the key file cannot be read.
    """
    for chain_report in verify_tree(store, invocation_id):
        if not chain_report.intact:
            at = chain_report.broken_at
            where = f" at position {at}" if at is not None else ""
            raise InconsistentHistoryError(
                invocation_id,
                f"the hash chain of {chain_report.kind} {chain_report.id} is broken{where}: "
                f"{chain_report.problem}; nothing ran (loop-actors audit verify {invocation_id})",
            )
    if not CheckpointDirectory(settings.directory).numbered():
        return checked  # no checkpoint written yet: nothing to check the log against
    key = load_signing_key(settings.key_file).verifier() if settings.key_file else None
    chain, commitments, _ = verify_directory(settings.directory, key, None)
    for finding in chain:
        _refuse(invocation_id, settings, finding)
    newest = max(commitments, key=lambda commitment: commitment.size)
    if checked == CheckedLog(newest.size, newest.head):
        return checked
    reports, _ = verify_log(store, commitments)
    for report in reports:
        if not report.ok:
            _refuse(invocation_id, settings, report)
    return CheckedLog(newest.size, newest.head)


def _refuse(invocation_id: str, settings: CheckpointSettings, finding: CheckpointReport) -> None:
    raise InconsistentHistoryError(
        invocation_id,
        f"the store does not agree with the checkpoints in {settings.directory}: "
        f"{finding.verdict.value}: {finding.problem or finding.source}; nothing ran "
        f"(loop-actors audit verify {invocation_id} --checkpoint-dir {settings.directory})",
    )


__all__ = ["CheckedLog", "check_before_resume"]
