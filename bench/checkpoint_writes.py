"""What writing one more checkpoint costs as the checkpoint directory grows.

A runtime with ``checkpoint_dir`` writes a checkpoint after each run that ends (and
every ``checkpoint_every`` commits), each a new numbered file chained to the one
before (``loop_actors.audit.checkpointer.CheckpointDirectory.write_next``: the note, a
temporary file, fsync, a hard link that never replaces a file, fsync of the
directory). A deployment that runs for months fills its directory with hundreds of
thousands of them.

This writes N checkpoints into a new directory, one after another, as one writer
does, and prints, at each mark, the mean wall and CPU time per write over the last
stretch, then what listing the directory and matching every name
(``CheckpointDirectory.numbered``) costs at that size (the least of three): what each
write cost when a writer listed the directory before every write.

    python bench/checkpoint_writes.py [--n 10000] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from loop_actors.audit.checkpoint import Checkpoint, checkpoint_note
from loop_actors.audit.checkpointer import CheckpointDirectory


def note_for(size: int) -> Callable[[Checkpoint | None, str], str | None]:
    """The note of a checkpoint of ``size`` rows, after the file ``write_next`` names."""

    def make(latest: Checkpoint | None, previous: str) -> str:
        head = hashlib.sha256(str(size).encode()).hexdigest()
        return checkpoint_note(
            "loop-actors/bench", size, head, None, extensions=[f"previous {previous}"]
        )

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="checkpoints to write")
    parser.add_argument("--dir", default=None, help="where the directory is made")
    args = parser.parse_args()
    if args.n < 1:
        parser.error("--n must be at least 1")
    marks = sorted({m for m in (args.n // 10, args.n // 2, args.n) if m >= 1})
    print(f"workload: {args.n:,} checkpoints written one after another by one writer")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = CheckpointDirectory(Path(tmp))
        done = 0
        for mark in marks:
            wall, cpu = time.perf_counter(), time.process_time()
            for size in range(done + 1, mark + 1):
                written = directory.write_next(note_for(size))
                assert written is not None
            count = mark - done
            per_write_ms = (time.perf_counter() - wall) / count * 1e3
            per_write_cpu_ms = (time.process_time() - cpu) / count * 1e3
            done = mark
            listings = []
            for _ in range(3):
                listed = time.perf_counter()
                files = directory.numbered()
                listings.append((time.perf_counter() - listed) * 1e3)
            listing_ms = min(listings)
            assert len(files) == mark
            print(
                f"{mark:>8,} in the directory: {per_write_ms:.2f} ms a write "
                f"({per_write_cpu_ms:.2f} ms CPU) over the last {count:,}; "
                f"listing them all: {listing_ms:.2f} ms"
            )


if __name__ == "__main__":
    main()
