"""The goals file of ``submit --goals``: one goal a line, or a JSON object a line.

A line that starts with ``{`` (after blanks) is a JSON object with a ``goal`` and
any of ``id``, ``task_class``, ``actor``, ``tenant`` (strings; ``null`` for none);
any other line is a goal as it is written, without its surrounding blanks. The two
may be mixed. A blank line, a malformed object, an unknown or repeated field, a goal
missing or empty: each is refused naming its line, before anything is written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

from loop_actors._errors import SubmissionError, SubmissionProblem
from loop_actors.runtime.submission import Submission

FIELDS = ("goal", "id", "task_class", "actor", "tenant")
"""The fields of a JSON line, in the order the help lists them."""

STDIN = "-"
"""The file name that reads standard input."""


class GoalsFile(NamedTuple):
    """The goals of a file, each with the number of its line (from 1; 0: an option's goal)."""

    name: str
    goals: list[Submission]
    lines: list[int]

    def where(self, index: int) -> str:
        """How the goal at ``index`` is named in a message: ``FILE:LINE`` (an option: its name)."""
        line = self.lines[index]
        return f"{self.name}:{line}" if line else self.name


def read_goals(
    name: str,
    *,
    task_class: str | None = None,
    actor: str | None = None,
    tenant: str | None = None,
) -> GoalsFile:
    """The goals of file ``name`` (``-``: standard input); the options fill in what a line lacks.

    Raises:
        SubmissionError: the file cannot be read (``unreadable_file``), holds no goal
            (``missing_goal``), or a line is blank, malformed or lacks its goal.
    """
    text = _text_of(name)
    goals: list[Submission] = []
    lines: list[int] = []
    defaults = {"task_class": task_class, "actor": actor, "tenant": tenant}
    rows = text.split("\n")
    if rows and rows[-1] == "":
        rows.pop()  # the newline that ends the last line
    for number, row in enumerate(rows, start=1):
        where = f"{name}:{number}"
        line = row.removesuffix("\r").strip()
        if not line:
            raise SubmissionError(
                where,
                SubmissionProblem.BLANK_LINE,
                "the line is blank (one goal a line; remove the blank line)",
                index=len(goals),
            )
        fields = _fields(line, where, len(goals)) if line.startswith("{") else {"goal": line}
        goals.append(
            Submission(
                goal=fields["goal"],
                invocation_id=fields.get("id"),
                task_class=fields.get("task_class") or defaults["task_class"],
                actor=fields.get("actor") or defaults["actor"],
                tenant=fields.get("tenant") or defaults["tenant"],
            )
        )
        lines.append(number)
    if not goals:
        raise SubmissionError(
            name, SubmissionProblem.MISSING_GOAL, "the file holds no goal", index=None
        )
    return GoalsFile(name, goals, lines)


def _text_of(name: str) -> str:
    """The file's text (UTF-8).

    Raises:
        SubmissionError: it does not exist, is not a file, cannot be read, or is not UTF-8.
    """
    try:
        data = sys.stdin.buffer.read() if name == STDIN else Path(name).read_bytes()
    except FileNotFoundError:
        raise _unreadable(name, "no such file") from None
    except IsADirectoryError:
        raise _unreadable(name, "it is a directory, not a file") from None
    except PermissionError:
        raise _unreadable(name, "permission denied") from None
    except OSError as error:
        raise _unreadable(name, error.strerror or type(error).__name__) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise _unreadable(f"{name}:{line}", "not UTF-8 text") from None


def _unreadable(where: str, why: str) -> SubmissionError:
    return SubmissionError(
        where, SubmissionProblem.UNREADABLE_FILE, f"cannot read the goals: {why}", index=None
    )


def _fields(line: str, where: str, index: int) -> dict[str, Any]:
    """The fields of a JSON line, checked.

    Raises:
        SubmissionError: not one JSON object, a field unknown, repeated or not a string,
            or no goal.
    """

    def malformed(why: str) -> SubmissionError:
        return SubmissionError(where, SubmissionProblem.MALFORMED_LINE, why, index=index)

    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for key, value in pairs:
            if key in fields:
                raise malformed(f"the field {key!r} is given twice")
            fields[key] = value
        return fields

    try:
        fields = json.loads(line, object_pairs_hook=once)
    except json.JSONDecodeError as error:
        raise malformed(
            f"not a JSON object: {error.msg} at column {error.colno} (a line that starts "
            "with '{' is read as JSON)"
        ) from None
    if not isinstance(fields, dict):
        raise malformed("not a JSON object (a line that starts with '{' is read as JSON)")
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise malformed(f"unknown field {unknown[0]!r} (a line's fields: {', '.join(FIELDS)})")
    for key, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise malformed(f"{key!r} must be a string, got {type(value).__name__}")
    goal = fields.get("goal")
    if goal is None or not goal.strip():
        raise SubmissionError(
            where,
            SubmissionProblem.MISSING_GOAL,
            "the line has no goal" if goal is None else "the goal is empty",
            index=index,
        )
    return fields
