"""The progress bar of ``loop-actors eval``: shown on a terminal only.

It is drawn on standard error, and only when both standard output and standard
error are terminals: output piped to a file or a program (a CI log, ``| tee``)
gets the table alone, byte for byte the same as without a bar. The bar is
transient: it is erased when the cases are done, before the table is printed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from projections.evaluation import CaseResult, CaseStatus


def progress_wanted(stdout: TextIO | None = None, stderr: TextIO | None = None) -> bool:
    """Whether to draw the bar: both streams are terminals."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    return out.isatty() and err.isatty()


@contextmanager
def case_progress(
    total: int, *, title: str, enabled: bool
) -> Iterator[Callable[[CaseResult], None] | None]:
    """A bar over ``total`` case runs; yields the callback that advances it (None if off)."""
    if not enabled:
        yield None
        return
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = progress.add_task(title, total=total, failed=0)
    failed = 0

    def advance(result: CaseResult) -> None:
        nonlocal failed
        failed += result.status is not CaseStatus.PASSED
        progress.update(task, advance=1, failed=failed)

    with progress:
        yield advance
