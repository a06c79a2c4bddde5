"""Every documented command-line sample prints what the page says it prints.

A sample is a ``console`` or ``text`` block whose first line starts with ``$ ``.
The commands of a page run in order, as a reader would run them, in one fresh
folder holding a copy of ``docs/examples`` (``python docs/examples/x.py`` runs
the copy), against the default database file there. Each command's output is
compared line by line with the lines under it, after replacing what differs
from run to run: timestamps, hex ids and digests (shortened ones, ``6e04474b…``,
too), durations. In a documented line, ``...`` stands for any text, a line of
its own ``...`` for any further lines, a trailing ``…`` for the rest of a
line the command cut, and ``~N`` for a number that varies from run to run: it
matches a number within 2% of N. Every other value is compared as printed.
``$ echo $?`` prints the previous command's exit code; a process killed by
SIGKILL prints ``Killed``, as a shell does.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.docs import ROOT

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "docs" / "examples"

RUN = [
    "docs/tutorial/first-agent.md",
    "docs/how-to/answer-a-clarification.md",
    "docs/how-to/approve-a-paused-call.md",
    "docs/how-to/resume-after-a-crash.md",
    "docs/how-to/run-a-batch-of-invocations.md",
    "docs/how-to/authorise-calls.md",
    "docs/how-to/resolve-an-effect-by-hand.md",
    "docs/how-to/keep-checkpoints-outside-the-store.md",
    "docs/how-to/evaluate-your-loop.md",
    "docs/tutorial/evaluate-and-tune.md",
    "docs/reference/eval-builtin.md",
    "docs/how-to/read-logs-and-statistics.md",
    "docs/how-to/add-a-critic.md",
    "docs/how-to/schedule-an-agent.md",
]
"""Pages whose samples run from an empty folder, in the order they are written."""

NOT_RUN = {
    "docs/how-to/query-read-models.md": "reads the store the other how-tos left behind",
    "docs/how-to/cancel-a-running-invocation.md": "cancels ask-4, started on another page",
    "docs/reference/cli.md": "a reference of outputs seen on other pages",
    "docs/how-to/run-workers.md": "starts workers that run until stopped "
    "(tests/scenarios/test_workers.py runs these stories)",
    "docs/reference/audit-format.md": "tampers with a store by hand first",
    "docs/how-to/watch-and-approve-from-the-console.md": "serves until stopped "
    "(tests/console/test_console_browser.py runs this story in a browser)",
    "docs/how-to/stream-a-run-to-your-app.md": "needs a console serving "
    "(tests/console/test_stream_example.py runs the example against one)",
    "docs/reference/testing-crash-points.md": "runs the test suite",
    "README.md": "prints a random invocation id (the same command runs in the tutorial test)",
}
"""Pages with samples that are not run here, and why."""

TIMEOUT_S = 60


@dataclass
class Sample:
    """One command of a page and the lines documented under it."""

    command: str
    expected: list[str] = field(default_factory=list)


def samples(page: Path) -> list[Sample]:
    """The commands of a page's samples, in order."""
    found: list[Sample] = []
    blocks = re.findall(
        r"^```(?:console|text)\n(.*?)^```$", page.read_text(), flags=re.MULTILINE | re.DOTALL
    )
    for block in blocks:
        lines = block.splitlines()
        if not lines or not lines[0].startswith("$ "):
            continue
        for line in lines:
            if line.startswith("$ "):
                found.append(Sample(line[2:]))
            else:
                found[-1].expected.append(line)
    return found


def _pages_with_samples() -> set[str]:
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    return {str(p.relative_to(ROOT)) for p in pages if samples(p)}


def test_every_page_with_samples_is_run_or_says_why_not() -> None:
    assert _pages_with_samples() == set(RUN) | set(NOT_RUN)


_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")
_HEX = re.compile(r"(?<![0-9a-zA-Z])[0-9a-f]{8,}(?:…|(?![0-9a-zA-Z]))")  # "6e04474b…" too
_DURATION = re.compile(r'("duration_ms": ?)[0-9.e-]+')


def normalise(line: str) -> str:
    """A line with what differs between runs replaced by placeholders."""
    line = _TIMESTAMP.sub("<time>", line)
    line = _DURATION.sub(r"\g<1><ms>", line)
    return _HEX.sub("<hex>", line)


_APPROXIMATE = re.compile(r"~(\d+(?:\.\d+)?)")
"""A documented number that varies from run to run (``view size ~4690``)."""

APPROXIMATE_TOLERANCE = 0.02


def _pattern(documented: str) -> tuple[str, list[float]]:
    """The regular expression of a documented line, and its ``~N`` numbers in order."""
    approximate: list[float] = []
    parts = []
    for part in documented.split("..."):
        pieces = _APPROXIMATE.split(part)  # text, number, text, number, ..., text
        for index, piece in enumerate(pieces):
            if index % 2:
                approximate.append(float(piece))
                parts.append(r"(\d+(?:\.\d+)?)")
            else:
                parts.append(re.escape(piece))
        parts.append(".*")
    return "".join(parts[:-1]), approximate


def _close(match: re.Match[str] | None, approximate: list[float]) -> bool:
    if match is None:
        return False
    found = [float(value) for value in match.groups()]
    return all(
        abs(got - want) <= APPROXIMATE_TOLERANCE * want
        for got, want in zip(found, approximate, strict=True)
    )


def line_matches(documented: str, printed: str) -> bool:
    """Whether a printed line is the documented one (see the module docstring)."""
    cut_documented = documented.endswith("…")
    cut_printed = printed.endswith("…")
    want = normalise(documented.removesuffix("…"))
    got = normalise(printed.removesuffix("…"))
    pattern, approximate = _pattern(want)
    if cut_documented or cut_printed:
        # Cut lines end where their data's length says: either may stop first.
        return _close(re.match(pattern, got), approximate) or want.startswith(got)
    return _close(re.fullmatch(pattern, got), approximate)


def output_matches(documented: list[str], printed: list[str]) -> bool:
    """Whether the printed lines are the documented ones (``...`` alone: any further lines)."""
    for position, line in enumerate(documented):
        if line == "...":
            return True
        if position >= len(printed) or not line_matches(line, printed[position]):
            return False
    return len(printed) == len(documented)


class Shell:
    """Runs a page's commands in one folder, the way the page's reader does."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.last_code = 0
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOP_ACTORS_", "PAY"))}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["COLUMNS"] = "200"
        self.env = env

    def run(self, command: str) -> list[str]:
        if command == "echo $?":
            return [str(self.last_code)]
        words = shlex.split(command)
        env = dict(self.env)
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        match words:
            case ["rm", *patterns]:
                for pattern in patterns:
                    for path in self.folder.glob(pattern):
                        path.unlink()
                return []
            case ["chmod", mode, *patterns]:
                for pattern in patterns:
                    for path in self.folder.glob(pattern):
                        path.chmod(int(mode, 8))
                return []
            case ["sqlite3", *rest]:
                shell = shutil.which("sqlite3")
                if shell is None:
                    pytest.skip("the page runs the sqlite3 shell, which is not installed")
                argv = [shell, *rest]
            case ["loop-actors", *rest]:
                argv = [sys.executable, "-m", "loop_actors.cli.main", *rest]
            case ["python", script, *rest]:
                argv = [sys.executable, script.removeprefix("docs/examples/"), *rest]
            case _:
                raise AssertionError(f"the test does not know how to run {command!r}")
        result = subprocess.run(
            argv,
            cwd=self.folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        self.last_code = result.returncode
        if result.returncode == -signal.SIGKILL:
            return ["Killed"]
        return (result.stdout + result.stderr).splitlines()


EXAMPLE_FILES = (".py", ".json", ".jsonl", ".yaml")
"""What docs/examples holds: the pages' scripts and their data."""


def _not_an_example(folder: str, names: list[str]) -> list[str]:
    """What a reader who ran the pages there left behind (stores, payments.db, folders)."""
    return [name for name in names if not name.endswith(EXAMPLE_FILES)]


@pytest.mark.parametrize("page", RUN)
def test_documented_command_output_matches_what_the_command_prints(
    page: str, tmp_path: Path
) -> None:
    shutil.copytree(EXAMPLES, tmp_path, dirs_exist_ok=True, ignore=_not_an_example)
    shell = Shell(tmp_path)
    for sample in samples(ROOT / page):
        printed = shell.run(sample.command)
        assert output_matches(sample.expected, printed), (
            f"{page}: `$ {sample.command}` printed\n"
            + "\n".join(printed)
            + "\n\nbut the page says\n"
            + "\n".join(sample.expected)
        )


@pytest.mark.parametrize(
    ("documented", "printed", "matches"),
    [
        ("steps=2 id=first-order", "steps=2 id=first-order", True),
        ("steps=2 id=first-order", "steps=3 id=first-order", False),
        ("id=a8bc703adb574279b84ee1c3aa4782b7", "id=9d915b7e9f76467191b81119024f4ba1", True),
        ("   1  2026-11-30T16:56:54.336177Z  X", "   1  2026-12-01T09:18:47.719690Z  X", True),
        ('{"a":1,"b":2…', '{"a":1,"b":2,"c":3}', True),
        ('{"a":1,"b":2…', '{"a":1,"b":3,"c":3}', False),
        ('{"a":1,"b":2,"c":3}', '{"a":1,"b"…', True),
        ("steps=2 id=...", "steps=2 id=anything", True),
        ('"digest": "6e04474b…"', '"digest": "6e04474b36e622ad201e27c21f8129dc"', True),
        ("completed", "completed extra", False),
        ("view size 4697 -> 1762 characters", "view size 4692 -> 1758 characters", False),
        ("view size ~4690 -> ~1760 characters", "view size 4692 -> 1758 characters", True),
        ("view size ~4690 -> ~1760 characters", "view size 4692 -> 1900 characters", False),
        ("took ~2.5 s", "took 2.52 s", True),
        ("took ~2.5 s", "took two s", False),
    ],
)
def test_the_comparison_replaces_only_what_varies(
    documented: str, printed: str, matches: bool
) -> None:
    assert line_matches(documented, printed) is matches


def test_the_comparison_refuses_missing_and_extra_lines() -> None:
    assert output_matches(["a", "..."], ["a", "b", "c"])
    assert not output_matches(["a", "b"], ["a"])
    assert not output_matches(["a"], ["a", "b"])
