"""A disk that really fills up: a 1 MiB tmpfs mounted for one test.

A full disk is simulated as it happens: the store lives on a file system of its own,
and another file takes the rest of its space, so that SQLite's next write gets
``ENOSPC`` from the kernel ("database or disk is full"). Mounting needs root (the
tests run as root in CI and in the project's containers); elsewhere the tests that
need it are skipped, saying why. (An ``RLIMIT_FSIZE`` would need no root, but SQLite
reports its ``EFBIG`` as a generic I/O error, not as a full disk; SQLite's
``max_page_count`` would only stop the database file, never its WAL or the queue.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SIZE = "1m"
"""The tmpfs's size: the store and its queue take about 100 KiB of it."""

FILLER = "filler"


@contextlib.contextmanager
def mounted_tiny_disk(folder: Path) -> Iterator[Path]:
    """Mount a tmpfs of :data:`SIZE` on ``folder``/disk for the block (skip without root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill it needs root")
    disk = folder / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0777", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(disk: Path) -> int:
    """Take every free byte of ``disk`` with one file; returns how many were taken."""
    written = 0
    chunk = b"\0" * 4096
    with (disk / FILLER).open("ab", buffering=0) as filler:
        while True:
            try:
                written += filler.write(chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                break
    return written


def free(disk: Path) -> None:
    """Give the space :func:`fill` took back."""
    (disk / FILLER).unlink()
