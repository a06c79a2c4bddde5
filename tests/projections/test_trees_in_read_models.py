"""Trees in the read models: metrics by tree, and the links of a handoff in show and list.

A parent that delegates two payments to children, and a triage that hands off to
billing, run in one store; `metrics --by tree` gives one row per root, with the tree's
invocations, calls and effects summed, and the root's own wall time; `show` names a
handoff's target (and its outcome) on the source and the source on the target, and
`list --json` rows carry `handed_off_from`.

Bad input tried: `metrics --by root` (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from aggregates.handoffs import handoff_id_of
from loop_actors import Runtime, TerminalReason
from projections import metrics
from tests.support.children_app import BOSS, TRIAGE
from tests.support.cli import run_cli


async def _run_trees(db: str) -> None:
    async with Runtime(db, follow_projections=True) as runtime:
        assert (await runtime.run(BOSS, "pay them", invocation_id="boss")).reason is (
            TerminalReason.COMPLETED
        )
        chained = await runtime.run(TRIAGE, "my refund", invocation_id="triage")
        assert chained.chain == ["triage", handoff_id_of("triage")]
        await runtime.run(BOSS.reachable_agents()[1], "pay 5", invocation_id="alone")
        assert runtime.projections is not None
        with trio.fail_after(30):
            while any(s.lag for s in runtime.projections.status()):  # noqa: ASYNC110 - polls a database
                await trio.sleep(0.01)
        rows = {row.group: row for row in metrics(runtime.projections, "tree")}
        by_agent = {row.group: row.invocations for row in metrics(runtime.projections, "agent")}
    assert sorted(rows) == ["alone", "boss", "triage"]
    boss = rows["boss"]
    assert (boss.invocations, boss.tool_calls, boss.running) == (
        3,
        4,
        0,
    )  # 2 delegations, 2 charges
    assert boss.effects == {"committed": 4}
    assert (rows["triage"].invocations, rows["triage"].tool_calls) == (2, 1)
    assert (rows["alone"].invocations, rows["alone"].tool_calls) == (1, 1)
    assert by_agent == {"billing": 1, "boss": 1, "payer": 3, "triage": 1}


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store holding the three trees."""
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges.txt"))
    url = f"sqlite:///{tmp_path / 'trees.db'}"
    trio.run(_run_trees, url)
    return url


def test_metrics_by_tree_sum_each_root_with_what_is_below_it(tmp_path: Path, db: str) -> None:
    done = run_cli("metrics", "--by", "tree", "--json", cwd=tmp_path, db=db)
    assert done.returncode == 0, done.stderr
    rows = {row["group"]: row for row in map(json.loads, done.stdout.splitlines())}
    assert {group: row["invocations"] for group, row in rows.items()} == {
        "alone": 1,
        "boss": 3,
        "triage": 2,
    }
    assert rows["boss"]["wall_ms_max"] == rows["boss"]["wall_ms_p50"]  # the root's own
    wrong = run_cli("metrics", "--by", "root", cwd=tmp_path, db=db)
    assert wrong.returncode == 2
    assert "invalid choice: 'root'" in wrong.stderr


def test_show_and_list_link_a_handoffs_source_and_target(tmp_path: Path, db: str) -> None:
    target = handoff_id_of("triage")
    source = run_cli("show", "triage", cwd=tmp_path, db=db)
    assert source.returncode == 0, source.stderr
    assert f"handed off to: {target} billing completed" in source.stdout.splitlines()
    shown = run_cli("show", target, cwd=tmp_path, db=db)
    assert "handed off from: triage" in shown.stdout.splitlines()
    listed = run_cli("list", "--json", cwd=tmp_path, db=db)
    rows = {row["invocation_id"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert rows[target]["handed_off_from"] == "triage"
    assert rows["triage"]["handed_off_from"] is None
    assert rows["boss"]["handed_off_from"] is None
    # show --json carries both links: the source names its target, the target its source.
    source_json = json.loads(run_cli("show", "triage", "--json", cwd=tmp_path, db=db).stdout)
    assert (source_json["handed_off_to"], source_json["handed_off_from"]) == (target, None)
    target_json = json.loads(run_cli("show", target, "--json", cwd=tmp_path, db=db).stdout)
    assert (target_json["handed_off_to"], target_json["handed_off_from"]) == (None, "triage")
