"""The exit codes of the ``loop-actors`` command (docs/reference/cli.md, "Exit codes")."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a ``loop-actors`` command's exit status means; the numbers are a contract."""

    OK = 0
    """The invocation completed, or the command did what it was asked."""
    INTERNAL_ERROR = 1
    """A bug of ours: one line on stderr."""
    USAGE_ERROR = 2
    """Bad usage or input: nothing was written."""
    PAUSED = 3
    """The invocation paused (``reconcile``: something may still settle by itself)."""
    NOT_COMPLETED = 4
    """The invocation ended with another reason (``eval``: a case failed)."""
    TAMPERED = 4
    """The store's history is not the one written: audit verify found a break, or resume refused."""
    DIVERGED = 4
    """``replay``: a replay departs from its recorded run."""
    NEEDS_PERSON = 5
    """``reconcile``: an open effect that only a person can settle is left (``effects resolve``)."""
    LEASE_HELD = 6
    """Another process drives the invocation: it holds a live lease on it, nothing ran
    (``--take-over``); or this run stopped ``lease_lost`` (that process wrote first)."""
    INTERRUPTED = 130
    """Ctrl-C."""
