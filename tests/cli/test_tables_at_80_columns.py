"""Tables keep every number and id on an 80-column terminal and through a pipe.

``eval``, ``eval compare``, ``list`` and ``effects`` run on a real pseudo-terminal 80
columns wide, and with their output piped: every number of every row is printed whole
(compared with the command's JSON), every id is printed whole, in order (on a terminal
an id may be folded onto a second line, never cut), no line is wider than the terminal
(``effects``: its two 44- and 5-character ids and numbers fit), and through a pipe
each row is one line. ``show`` cuts a call's arguments only where the terminal's
width says, not at 40 characters. Bad inputs tried: the built-in eval's long case
names, 32-character invocation ids, a goal of several lines' length, a tool argument
of 144 characters.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import termios
from pathlib import Path

import pytest

from tests.docs.test_docs_samples import EXAMPLES, Shell, _not_an_example
from tests.support.cli import CLI, cli_env, run_cli

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
WIDTH = 80


def on_terminal(*args: str, cwd: Path, columns: int = WIDTH) -> list[str]:
    """What the command prints to a pseudo-terminal ``columns`` wide (colours removed)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = cli_env(COLUMNS=str(columns), TERM="xterm")
    process = subprocess.Popen(
        [*CLI, *args], cwd=cwd, env=env, stdout=follower, stderr=subprocess.DEVNULL
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower closed: the command ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=120) == 0
    text = ANSI.sub("", b"".join(chunks).decode()).replace("\r", "")
    return [line.rstrip() for line in text.splitlines()]


def piped(*args: str, cwd: Path) -> list[str]:
    result = run_cli(*args, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def first_column(lines: list[str], ends: str | None = None) -> str:
    """A compact table's first column below its header rule, joined: folded ids come out whole.

    The table ends at the first line holding ``ends`` (its caption), else with the output.
    """
    rule = next(i for i, line in enumerate(lines) if line.startswith("─"))
    body = lines[rule + 1 :]
    if ends is not None:
        body = body[: next(i for i, line in enumerate(body) if ends in line)]
    starts = [line for line in body if line and not line.startswith(" ")]
    width = max(len(line.split(" ")[0]) for line in starts)
    return "".join(line[:width].strip() for line in starts)


# --------------------------------------------------------------------------- eval


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("eval")
    for name in ("a", "b"):
        ran = run_cli(
            "eval",
            "--builtin",
            "--json",
            f"{name}.json",
            cwd=folder,
            db=f"sqlite:///{folder / name}.db",
        )
        assert ran.returncode == 0, ran.stderr
    return folder


EVAL_NUMBERS = re.compile(r"(\d+) +(\d+) +(\d+) +(\d+\.\d{4}) +(\d+\.\d)$")
DELTAS = re.compile(r"([+-]\d+) +([+-]\d+) +([+-]\d+) +([+-]\d+\.\d{4}) +([+-]\d+\.\d)$")


def _eval_rows(report: dict[str, object]) -> list[tuple[str, ...]]:
    cases = report["cases"]
    assert isinstance(cases, list)
    return [
        (str(c["steps"]), str(c["tool_calls"]), str(c["tokens"]), f"{c['cost']:.4f}",
         f"{c['latency_ms']:.1f}")
        for c in cases
    ]  # fmt: skip


@pytest.mark.parametrize("where", ["terminal", "pipe"])
def test_eval_prints_every_number_and_case_whole(reports: Path, where: str) -> None:
    report = json.loads((reports / "a.json").read_text())
    args = ("eval", "--builtin", "--db", f"sqlite:///{reports / where}.db")
    lines = on_terminal(*args, cwd=reports) if where == "terminal" else piped(*args, cwd=reports)
    printed = json.loads((reports / "a.json").read_text())  # the cases and their order
    rows = [m.groups() for line in lines if (m := EVAL_NUMBERS.search(line))]
    assert len(rows) == len(printed["cases"])
    names = [f"{c['case_id']}#{c['epoch']}" for c in report["cases"]]
    if where == "terminal":
        assert max(len(line) for line in lines) <= WIDTH
        assert first_column(lines, ends="passed, ") == "".join(names)
    else:
        assert [line.split()[0] for line in lines if EVAL_NUMBERS.search(line)] == names


@pytest.mark.parametrize("where", ["terminal", "pipe"])
def test_eval_compare_prints_every_delta_and_case_whole(reports: Path, where: str) -> None:
    args = ("eval", "compare", "a.json", "b.json")
    lines = on_terminal(*args, cwd=reports) if where == "terminal" else piped(*args, cwd=reports)
    assert run_cli(*args, "--json", "cmp.json", cwd=reports).returncode == 0
    comparison = json.loads((reports / "cmp.json").read_text())
    expected = [
        (f"{r['steps']:+d}", f"{r['tool_calls']:+d}", f"{r['tokens']:+d}", f"{r['cost']:+.4f}",
         f"{r['latency_ms']:+.1f}")
        for r in comparison["cases"]
    ]  # fmt: skip
    assert [m.groups() for line in lines if (m := DELTAS.search(line))] == expected
    names = [f"{r['case_id']}#{r['epoch']}" for r in comparison["cases"]]
    if where == "terminal":
        assert max(len(line) for line in lines) <= WIDTH
        assert first_column(lines, ends=" paired; ") == "".join(names)
    else:
        assert [line.split()[0] for line in lines if DELTAS.search(line)] == names


def test_eval_rows_match_the_report(reports: Path) -> None:
    """The numbers of the terminal's rows are the report's, row by row."""
    lines = on_terminal(
        "eval",
        "--builtin",
        "--json",
        "c.json",
        "--db",
        f"sqlite:///{reports / 'c'}.db",
        cwd=reports,
    )
    report = json.loads((reports / "c.json").read_text())
    assert [m.groups() for line in lines if (m := EVAL_NUMBERS.search(line))] == _eval_rows(report)


# --------------------------------------------------------------------------- list, effects


AGENTS = '''
from loop_actors import Agent, ScriptedModel, tool


@tool
def echo(text: str) -> str:
    """Echo the text back, shouting."""
    return text.upper()


LONG = "the quick brown fox jumps over the lazy dog and keeps running far away " * 2


def _echoing(request):
    if request.step <= 2:
        return {"kind": "tool_calls", "calls": [{"id": f"c{request.step}", "name": "echo", "arguments": {"text": LONG + str(request.step)}}]}
    return {"kind": "final", "answer": "done"}


agent = Agent("an-agent-with-a-long-name", ScriptedModel(_echoing), tools=[echo])
'''

GOAL = "Read every page of the manual, then write a summary of each chapter for the team"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("list")
    (folder / "agents.py").write_text(AGENTS)
    for _ in range(3):
        ran = run_cli("run", "agents:agent", "--goal", GOAL, cwd=folder)  # a uuid4 id each
        assert ran.returncode == 0, ran.stderr
    return folder


LIST_NUMBERS = re.compile(r"[ │](\d+)[ │]+(\d+)[ │]+20\d\d-\d\d-\d\d")


@pytest.mark.parametrize("where", ["terminal", "pipe"])
def test_list_prints_every_number_and_id_whole(store: Path, where: str) -> None:
    rows = [json.loads(line) for line in piped("list", "--json", cwd=store)]
    lines = on_terminal("list", cwd=store) if where == "terminal" else piped("list", cwd=store)
    numbers = [m.groups() for line in lines if (m := LIST_NUMBERS.search(line))]
    assert numbers == [(str(r["steps"]), str(r["tool_calls"])) for r in rows]
    if where == "terminal":
        assert max(len(line) for line in lines) <= WIDTH
        assert first_column(lines) == "".join(r["invocation_id"] for r in rows)
    else:
        for row in rows:
            assert any(row["invocation_id"] in line for line in lines)


def test_show_cuts_arguments_only_where_the_terminal_ends(store: Path) -> None:
    (row, *_) = [json.loads(line) for line in piped("list", "--json", cwd=store)]
    wide = on_terminal("show", row["invocation_id"], cwd=store, columns=250)
    calls = [line for line in wide if " echo(" in line]
    assert calls
    assert all("keeps running far away " * 1 + "the quick" in line for line in calls)
    assert all(len(line) <= 250 for line in wide)
    narrow = on_terminal("show", row["invocation_id"], cwd=store)
    assert all(len(line) <= WIDTH for line in narrow)


@pytest.fixture(scope="module")
def open_effects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("effects")
    shutil.copytree(EXAMPLES, folder, dirs_exist_ok=True, ignore=_not_an_example)
    shell = Shell(folder)
    shell.run(
        "LOOP_ACTORS_CRASH_AT=after_write_returned:1 loop-actors run payments_agent:agent "
        '--goal "Pay dave 40 and erin 2000" --id pay-2'
    )
    assert shell.run("PAYMENTS_DOWN=1 loop-actors resume pay-2 --agent payments_agent:agent")[
        0
    ] == ("reconciliation_required")
    return folder


@pytest.mark.parametrize("where", ["terminal", "pipe"])
def test_effects_prints_every_key_and_number_whole(open_effects: Path, where: str) -> None:
    rows = [json.loads(line) for line in piped("effects", "--json", cwd=open_effects)]
    assert len(rows) == 2
    args = ("effects",)
    lines = (
        on_terminal(*args, cwd=open_effects)
        if where == "terminal"
        else piped(*args, cwd=open_effects)
    )
    keys = "".join(r["effect_key"] for r in rows)
    if where == "terminal":
        assert max(len(line) for line in lines) <= WIDTH
        assert first_column(lines) == keys
        pattern = re.compile(r" pay-2 +(\d+) +(p\d) ")
    else:
        pattern = re.compile(r"(eff-[0-9a-f]{40})[ │]+pay-2[ │]+(\d+)[ │]+(p\d) ")
    found = [m.groups() for line in lines if (m := pattern.search(line))]
    if where == "pipe":
        assert found == [(r["effect_key"], str(r["step"]), r["call_id"]) for r in rows]
    else:
        assert found == [(str(r["step"]), r["call_id"]) for r in rows]
