"""Located problems of an eval input (a cases file, a report): the error and its lines.

A file that cannot be read, is not JSON (YAML) or breaks its model is refused with one
line per problem, each with where it is (``cases[1].expect.reason: ...``); the CLI exits 2.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from loop_actors._errors import UsageError


class EvalInputError(UsageError):
    """Raised when a cases file or a report cannot be read: one line per problem, located."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s)\n{lines}")


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text or "(file)"


def problems_of(error: ValidationError) -> list[str]:
    """One line per error of a validation: its location, then pydantic's message."""
    problems = []
    for item in error.errors(include_url=False):
        # Union members add their type names to the location; keep the fields only.
        loc = tuple(p for p in item["loc"] if isinstance(p, int) or not any(c in p for c in "[("))
        message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{_location(loc)}: {message}" if loc else message)
    return problems


def read_text(path: Path) -> str:
    """The file as UTF-8 text.

    Raises:
        EvalInputError: it cannot be read, or is not UTF-8.
    """
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise EvalInputError(str(path), [f"cannot read: {error}"]) from None


def parse_json(source: str, text: str) -> object:
    """``text`` parsed as JSON.

    Raises:
        EvalInputError: it is not JSON (the line and column of the first problem).
    """
    try:
        data: object = json.loads(text)
    except json.JSONDecodeError as error:
        raise EvalInputError(
            source, [f"line {error.lineno} column {error.colno}: not JSON: {error.msg}"]
        ) from None
    return data
