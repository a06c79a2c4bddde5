"""What a new user reads is right: the effects sample, who settles an effect, plain messages.

The read-models how-to's ``effects --json`` sample is what the command prints (every
field, values included but the times); ``effects`` without ``--agent`` does not say
``person`` for an effect that ``reconcile`` then settles by itself; a report path that
is a folder, or in a folder that does not exist, and a model without its key, are
said in plain words; a checkpoint of another store is reported ``another_store``, not
``forked``. Bad inputs tried: a report path that is a folder and one in a missing
folder; a run with ``--model openai:...`` and no key; a checkpoint note of store A
given to store B's verify, alone and as a checkpoint directory.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.docs.test_docs_samples import EXAMPLES, Shell, _not_an_example, output_matches
from tests.support.cli import run_cli
from tests.support.docs import ROOT

PAGE = ROOT / "docs" / "how-to" / "query-read-models.md"


def _documented_output(page: Path, command: str) -> list[str]:
    """The lines a page documents under ``$ COMMAND``."""
    lines = page.read_text().splitlines()
    start = lines.index(f"$ {command}") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(("$ ", "```")))
    return lines[start:end]


@pytest.fixture
def paused_payment(tmp_path: Path) -> Shell:
    """pay-2 of the crash how-to: its two payments dispatched, the service down at resume."""
    shutil.copytree(EXAMPLES, tmp_path, dirs_exist_ok=True, ignore=_not_an_example)
    shell = Shell(tmp_path)
    shell.run(
        "LOOP_ACTORS_CRASH_AT=after_write_returned:1 loop-actors run payments_agent:agent "
        '--goal "Pay dave 40 and erin 2000" --id pay-2'
    )
    resumed = shell.run("PAYMENTS_DOWN=1 loop-actors resume pay-2 --agent payments_agent:agent")
    assert resumed[0] == "reconciliation_required", resumed
    return shell


def test_the_effects_json_sample_is_what_effects_json_prints(paused_payment: Shell) -> None:
    documented = _documented_output(PAGE, "loop-actors effects --json")
    printed = paused_payment.run("loop-actors effects --json")
    assert output_matches(documented, printed), "\n".join(printed)


def test_an_ended_invocations_effect_is_not_said_to_need_a_person_when_reconcile_settles_it(
    paused_payment: Shell,
) -> None:
    """pay's tool has a reconcile: after a cancel, ``reconcile`` settles its writes alone."""
    assert paused_payment.run("loop-actors cancel pay-2 --by bob") == ["pay-2: ended"]
    needs = {json.loads(line)["needs"] for line in paused_payment.run("loop-actors effects --json")}
    assert needs == {"reconcile_or_person"}
    with_agent = paused_payment.run("loop-actors effects --json --agent payments_agent:agent")
    assert {json.loads(line)["needs"] for line in with_agent} == {"sweeper"}
    swept = paused_payment.run("loop-actors reconcile --agent payments_agent:agent")
    assert paused_payment.last_code == 0, swept
    assert paused_payment.run("loop-actors effects --json") == []


CASES = {
    "name": "words",
    "agent": "eval_agent:agent",
    "cases": [
        {
            "id": "greets",
            "goal": "say hello",
            "task_class": "chat",
            "model": [{"kind": "final", "answer": "hi"}],
        }
    ],
}


@pytest.mark.parametrize(
    ("report", "said"),
    [
        ("missing/report.json", "cannot write the report to missing/report.json: there is no "
         "folder missing"),
        ("a-folder", "cannot write the report to a-folder: it is a folder"),
    ],
)  # fmt: skip
def test_a_report_path_that_cannot_be_written_is_said_plainly(
    tmp_path: Path, report: str, said: str
) -> None:
    shutil.copy(EXAMPLES / "eval_agent.py", tmp_path)
    (tmp_path / "cases.json").write_text(json.dumps(CASES))
    (tmp_path / "a-folder").mkdir()
    result = run_cli("eval", "cases.json", "--json", report, cwd=tmp_path)
    assert (result.returncode, result.stderr.strip()) == (2, f"loop-actors: error: {said}")


def test_a_model_without_its_key_names_the_variable_and_the_model(tmp_path: Path) -> None:
    pytest.importorskip("openai")
    shutil.copy(EXAMPLES / "first_agent.py", tmp_path)
    result = run_cli(
        "run", "first_agent:agent", "--goal", "hi", "--model", "openai:gpt-4o-mini",
        cwd=tmp_path, env={"OPENAI_API_KEY": ""},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "loop-actors: error: set OPENAI_API_KEY (or give api_key) to use openai:gpt-4o-mini"
    )


def test_a_checkpoint_of_another_store_is_reported_as_such(tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "first_agent.py", tmp_path)
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    for db in (a, b):
        ran = run_cli("run", "first_agent:agent", "--goal", "A-1001?", cwd=tmp_path, db=db)
        assert ran.returncode == 0, ran.stderr
    run_cli(
        "run",
        "first_agent:agent",
        "--goal",
        "A-1001",
        "--checkpoint-dir",
        "cps",
        cwd=tmp_path,
        db=a,
    )
    assert run_cli("audit", "checkpoint", "--out", "a.txt", cwd=tmp_path, db=a).returncode == 0
    for given in (["--against", "a.txt"], ["--checkpoint-dir", "cps"]):
        verified = run_cli("audit", "verify", "--json", *given, cwd=tmp_path, db=b)
        assert verified.returncode == 4, verified.stderr
        reports = [json.loads(line) for line in verified.stdout.splitlines()]
        verdicts = {r["verdict"] for r in reports if r.get("kind") == "checkpoint"}
        assert verdicts == {"another_store"}
        text = run_cli("audit", "verify", *given, cwd=tmp_path, db=b).stdout
        assert re.search(r"^another_store checkpoint .*it is of loop-actors/", text, re.MULTILINE)
