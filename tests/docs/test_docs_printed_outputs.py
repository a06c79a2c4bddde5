"""Every output a how-to shows under its code is what the example prints, values included.

A ``text`` block that a page marks ``<!-- printed by: COMMAND -->`` (the line before
it) is run: COMMAND (``python x.py``, as ``tests/docs/test_docs_samples.py`` runs a page's
commands) in a fresh copy of ``docs/examples``, and the block's lines must be found,
one after the other, in what it printed; a page's blocks of one command in the order
the page shows them. Lines are compared as ``test_docs_samples`` compares them: every
value as printed, but for ids, times, durations, ``...`` and the numbers written
``~N`` (the sample says that they vary). Every ``text`` block of a how-to or a
tutorial that is not a command's sample (``$ ``) is marked so, or
``<!-- not run: why -->``. Bad inputs tried: a sample with a stale number (the
compaction how-to's ``4697 -> 1762``), a block whose lines are out of order.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.docs.test_docs_samples import EXAMPLES, Shell, _not_an_example, line_matches
from tests.support.docs import ROOT

MARKED = re.compile(r"^<!-- printed by: (.+?) -->\n```text\n(.*?)^```$", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"^<!-- not run: .+? -->\n```text\n", re.MULTILINE)
TEXT_BLOCK = re.compile(r"^```text\n(.*?)^```$", re.MULTILINE | re.DOTALL)
GUARDED = ("docs/how-to", "docs/tutorial")
"""The pages whose every output block must be run (or say why not)."""


def printed_blocks(page: Path) -> list[tuple[str, list[str]]]:
    """The page's marked blocks: the command that prints each, and its lines."""
    return [(m[1], m[2].splitlines()) for m in MARKED.finditer(page.read_text())]


def _pages() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [str(p.relative_to(ROOT)) for p in pages if printed_blocks(p)]


def find_block(block: list[str], printed: list[str], start: int) -> int | None:
    """Where the block's lines begin, one after the other, in ``printed[start:]``."""
    for at in range(start, len(printed) - len(block) + 1):
        if all(line_matches(line, printed[at + i]) for i, line in enumerate(block)):
            return at
    return None


@pytest.mark.parametrize("page", _pages())
def test_a_pages_printed_outputs_are_what_its_examples_print(page: str, tmp_path: Path) -> None:
    outputs: dict[str, list[str]] = {}
    cursors: dict[str, int] = {}
    for command, block in printed_blocks(ROOT / page):
        if command not in outputs:
            folder = tmp_path / f"run-{len(outputs)}"
            shutil.copytree(EXAMPLES, folder, ignore=_not_an_example)
            outputs[command] = Shell(folder).run(command)
            cursors[command] = 0
        at = find_block(block, outputs[command], cursors[command])
        assert at is not None, (
            f"{page}: `{command}` printed\n"
            + "\n".join(outputs[command])
            + "\n\nwhich does not hold, after what the page showed before,\n"
            + "\n".join(block)
        )
        cursors[command] = at + len(block)


def test_every_output_block_of_a_how_to_or_tutorial_is_run_or_says_why_not() -> None:
    unmarked = []
    for page in sorted(p for folder in GUARDED for p in (ROOT / folder).glob("*.md")):
        text = page.read_text()
        marked = {m.start(2) for m in MARKED.finditer(text)}
        said = {m.end() for m in NOT_RUN.finditer(text)}
        for block in TEXT_BLOCK.finditer(text):
            if block[1].startswith("$ ") or block.start(1) in marked | said:
                continue
            line = text[: block.start()].count("\n") + 1
            unmarked.append(f"{page.relative_to(ROOT)}:{line}")
    assert unmarked == []


def test_a_stale_number_or_lines_out_of_order_are_not_found() -> None:
    printed = ["5 ContextCompacted", "view size 4692 -> 1758 characters", "turns: 9"]
    assert find_block(["view size 4697 -> 1762 characters"], printed, 0) is None
    assert find_block(["view size ~4690 -> ~1760 characters"], printed, 0) == 1
    assert find_block(["turns: 9", "5 ContextCompacted"], printed, 0) is None
    assert find_block(["5 ContextCompacted"], printed, 1) is None
