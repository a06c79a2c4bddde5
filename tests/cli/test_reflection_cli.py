"""Reflection seen from the command line: ``run --json``, ``show`` and ``history``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support import critic_app
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow


def test_the_cli_shows_each_critic_round_and_its_usage_apart(tmp_path: Path) -> None:
    shutil.copy(critic_app.__file__, tmp_path / "critic_app.py")
    db = f"sqlite:///{tmp_path / 'run.db'}"

    ran = run_cli(
        "run", "critic_app:agent", "--goal", critic_app.GOAL, "--id", "r-1", "--json",
        cwd=tmp_path, db=db,
    )  # fmt: skip
    shown = run_cli("show", "r-1", cwd=tmp_path, db=db)
    history = run_cli("history", "r-1", "--json", cwd=tmp_path, db=db)

    assert ran.returncode == 0, ran.stderr
    outcome = json.loads(ran.stdout)
    assert outcome["answer"] == critic_app.ANSWER
    assert outcome["critic"] == {
        "rounds": 2,
        "verdicts": ["revise", "accept"],
        "input_tokens": 100,
        "output_tokens": 0,
        "cost": 0.0,
    }
    assert shown.returncode == 0, shown.stderr
    assert "critic round 1: revise — Say how many pears there are." in shown.stdout
    assert "critic round 2: accept" in shown.stdout
    assert "critic: 2 round(s)  tokens=100/0" in shown.stdout
    records = [json.loads(line) for line in history.stdout.splitlines()]
    verdicts = [r["data"] for r in records if r["type"] == "CritiqueReturned"]
    assert [(v["round"], v["step"], v["verdict"]) for v in verdicts] == [
        (1, 2, "revise"),
        (2, 3, "accept"),
    ]
