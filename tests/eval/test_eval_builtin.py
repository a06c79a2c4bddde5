"""``loop-actors eval --builtin``: seed 000's branch cases, each shown to fail when what it
guards is broken; eval runs killed midway and re-run; ``--rerun-failed``; group commit."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import trio

from loop_actors import Agent, InvocationNotFoundError, Runtime, ScriptedModel
from loop_actors.eval.builtin import GUARDS, Fault, builtin_jobs, builtin_suite, service_file
from loop_actors.eval.evaluate import Case, Job, Suite, run_jobs, suite_jobs
from projections.evaluation import CaseStatus
from tests.support.cli import run_cli
from tests.support.eval import read_report

pytestmark = pytest.mark.slow

CASE_IDS = [
    "direct-answer",
    "one-tool-call",
    "parallel-out-of-order",
    "malformed-and-unknown",
    "partial-batch-failure",
    "approval-required-write",
    "repeated-plan",
    "cancel-while-tools-run",
    "crash-after-dispatch",
    "resume-existing-effect-key",
    "validator-rejects-answer",
]
"""One case per branch of seed 000's list, in its order."""


async def _history(url: str, invocation_id: str) -> list[Any]:
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            return list(await runtime.history(invocation_id))


def test_the_builtin_cases_are_one_per_branch_and_each_states_what_it_proves() -> None:
    cases = builtin_suite().cases
    assert [case.id for case in cases] == CASE_IDS
    assert all(case.proves for case in cases)
    assert sorted(GUARDS.values()) == sorted(CASE_IDS)  # every case has its fault
    assert len(set(GUARDS.values())) == len(GUARDS)


def test_eval_builtin_passes_every_case_on_this_install(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'eval.db'}"
    result = run_cli(
        "eval", "--builtin", "--json", "r.json", "--html", "r.html", cwd=tmp_path, db=url
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = read_report(tmp_path / "r.json")
    page = (tmp_path / "r.html").read_text()
    assert "<dt>proves</dt><dd>a final answer ends the run at once" in page
    assert report["suite"] == "builtin"
    assert [(c["case_id"], c["status"]) for c in report["cases"]] == [
        (case_id, "passed") for case_id in CASE_IDS
    ]
    by_id = {c["case_id"]: c for c in report["cases"]}
    assert by_id["crash-after-dispatch"]["proves"].startswith("a process killed (SIGKILL)")
    assert {c["attempts"] for c in report["cases"]} == {1}
    assert "11/11 passed" in result.stdout
    # The crash cases charged the payment service (outside the store) exactly once each.
    from loop_actors import EventStore

    store = EventStore(url)
    service = service_file(store.store_id)
    store.close()
    with closing(sqlite3.connect(service)) as db:
        charges = db.execute(
            "SELECT recipient, COUNT(*) FROM charges GROUP BY invocation_id, recipient"
        ).fetchall()
    assert sorted(charges) == [("bob", 1), ("carol", 1)]


async def test_the_resumed_write_uses_the_services_receipt_for_its_existing_key(
    tmp_path: Path,
) -> None:
    """The run was killed after the service committed the payment: resume reconciles it."""
    url = f"sqlite:///{tmp_path / 'eval.db'}"
    jobs = builtin_jobs(only=["resume-existing-effect-key", "crash-after-dispatch"])
    with trio.fail_after(60):
        results = await run_jobs(Runtime(url), jobs, concurrency=2)
    assert [r.status for r in results] == [CaseStatus.PASSED, CaseStatus.PASSED]
    by_case = {r.case_id: r.invocation_id for r in results}
    existing = await _history(url, by_case["resume-existing-effect-key"])
    after_dispatch = await _history(url, by_case["crash-after-dispatch"])
    statuses = [
        [result.effect_status for result in event.results]
        for event in existing
        if type(event).__name__ == "ResultsCommitted"
    ]
    assert statuses == [["reconciled"]]  # the receipt of the key, not a second payment
    dispatched = [
        [result.effect_status for result in event.results]
        for event in after_dispatch
        if type(event).__name__ == "ResultsCommitted"
    ]
    assert dispatched == [["committed"]]  # "not found": dispatched again, with the same key


BROKEN: dict[Fault, set[str]] = {
    Fault.NEEDLESS_TOOL_CALL: {"limits.max_steps", "limits.max_tool_calls"},
    Fault.WRONG_TOOL: {"answer.equals", "tools.sequence(exact)"},
    Fault.READS_RUN_IN_SEQUENCE: {"answer.equals"},
    Fault.LENIENT_ARGUMENTS: {"tools.sequence(exact)", "limits.max_tool_calls"},
    Fault.WHOLE_BATCH_RETRIED: {"reason", "answer.equals", "tools.sequence(exact)"},
    Fault.APPROVAL_RULE_REMOVED: {
        "reason",
        "tools.forbidden[refund]",
        "approvals.required[refund]",
        "effects.never_attempted[refund]",
    },
    Fault.REPEATED_PLAN_LIMIT_TOO_HIGH: {"limits.max_tool_calls"},
    Fault.CANCEL_IGNORED: {
        "reason",
        "tools.forbidden[notify_customer]",
        "effects.never_attempted[notify_customer]",
    },
    Fault.WRITE_WITHOUT_RECONCILIATION: {
        "reason",
        "answer.equals",
        "effects.no_outcome_unknown",
        "effects.committed[pay]",
    },
    Fault.WRITE_IGNORES_EFFECT_KEY: {"answer.equals"},
    Fault.VERIFIER_ACCEPTS_EVERYTHING: {"answer.equals"},
}
"""The expectations each fault must break in its case."""

WHY: dict[Fault, str] = {
    Fault.NEEDLESS_TOOL_CALL: "used 1, limit 0",
    Fault.WRONG_TOOL: "the run's tool steps were [{search}]",
    Fault.READS_RUN_IN_SEQUENCE: "read_policy did not run alongside read_profile",
    Fault.LENIENT_ARGUMENTS: "the run's tool steps were [{lookup}, {lookup}]",
    Fault.WHOLE_BATCH_RETRIED: "expected completed, got no_progress",
    Fault.APPROVAL_RULE_REMOVED: "expected approval_required, got completed",
    Fault.REPEATED_PLAN_LIMIT_TOO_HIGH: "used 4, limit 1",
    Fault.CANCEL_IGNORED: "expected cancelled, got completed",
    Fault.WRITE_WITHOUT_RECONCILIATION: "expected completed, got reconciliation_required",
    Fault.WRITE_IGNORES_EFFECT_KEY: "got 'carol charged 2 time(s)'",
    Fault.VERIFIER_ACCEPTS_EVERYTHING: "got 'soon, probably'",
}
"""A piece of the reason each fault's case gives."""


@pytest.mark.parametrize("fault", list(Fault), ids=[fault.value for fault in Fault])
async def test_each_builtin_case_fails_when_the_behaviour_it_guards_is_broken(
    tmp_path: Path, fault: Fault
) -> None:
    url = f"sqlite:///{tmp_path / 'eval.db'}"
    case_id = GUARDS[fault]
    with trio.fail_after(60):
        healthy, broken = await run_jobs(
            Runtime(url),
            [*builtin_jobs(only=[case_id]), *builtin_jobs([fault], only=[case_id])],
            concurrency=2,
        )
    assert healthy.status is CaseStatus.PASSED, healthy.failures or healthy.error
    assert broken.status is CaseStatus.FAILED, broken.error
    assert broken.invocation_id != healthy.invocation_id  # the fault is in the agent's version
    assert {f.expectation for f in broken.failures} == BROKEN[fault]
    assert any(WHY[fault] in (f.why or "") for f in broken.failures), broken.failures


def test_a_builtin_fault_on_the_command_line_fails_its_case_and_exits_4(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'eval.db'}"
    result = run_cli(
        "eval",
        "--builtin",
        "--builtin-fault",
        "verifier_accepts_everything",
        "--json",
        "r.json",
        cwd=tmp_path,
        db=url,
    )
    assert result.returncode == 4, result.stderr
    report = read_report(tmp_path / "r.json")
    failed = [c["case_id"] for c in report["cases"] if c["status"] != "passed"]
    assert failed == ["validator-rejects-answer"]
    assert report["totals"]["false_success"] == 1
    assert "validator-rejects-answer#1 proves: a final answer that fails" in result.stdout


async def _histories(url: str, ids: dict[str, str]) -> dict[str, list[Any]]:
    """The events of each case's run that exists."""
    found: dict[str, list[Any]] = {}
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            for case_id, invocation_id in ids.items():
                try:
                    found[case_id] = list(await runtime.history(invocation_id))
                except InvocationNotFoundError:
                    continue
    return found


async def test_an_eval_run_killed_midway_finishes_without_rerunning_finished_cases(
    tmp_path: Path,
) -> None:
    """SIGKILL at the third results commit, one case at a time (in an order trio picks):
    the same command again continues the case it killed and runs no finished case again."""
    url = f"sqlite:///{tmp_path / 'eval.db'}"
    args = ("eval", "--builtin", "--concurrency", "1", "--json", "r.json")
    killed = run_cli(
        *args, cwd=tmp_path, db=url, env={"LOOP_ACTORS_CRASH_AT": "after_results_commit:3"}
    )
    assert killed.returncode == -9
    ids = {job.case.id: _first_id(job) for job in builtin_jobs()}
    before = await _histories(url, ids)
    ended = ("Terminated", "Paused")
    finished = {c: events for c, events in before.items() if type(events[-1]).__name__ in ended}
    interrupted = [c for c in before if c not in finished]
    assert finished  # the first two results commits were of cases that ended
    assert len(interrupted) == 1  # killed mid-case, right after its results were committed
    cut = [type(e).__name__ for e in before[interrupted[0]]]
    assert cut[-1] == "ResultsCommitted"

    again = run_cli(*args, cwd=tmp_path, db=url)
    assert again.returncode == 0, again.stdout + again.stderr
    after = await _histories(url, ids)
    for case_id, events in finished.items():  # not run again: the same events, no more
        assert after[case_id] == events
    resumed = [type(e).__name__ for e in after[interrupted[0]]]
    assert resumed[: len(cut)] == cut  # continued from its events, not started again
    assert resumed.count("InvocationStarted") == 1
    assert resumed[-1] in ended
    report = read_report(tmp_path / "r.json")
    assert [c["status"] for c in report["cases"]] == ["passed"] * len(CASE_IDS)
    assert [c["invocation_id"] for c in report["cases"]] == [ids[c] for c in CASE_IDS]


def _first_id(job: Job) -> str:
    from loop_actors.eval.evaluate import case_invocation_id

    return case_invocation_id(job.suite, job.case, job.epoch, job.agent)


FLAKY_AGENT = """
from pathlib import Path
from loop_actors import Agent, ScriptedModel

def answer(request):
    return {"kind": "final", "answer": Path("answer.txt").read_text().strip()}

agent = Agent("flaky", ScriptedModel(answer))
"""

FLAKY_CASES: dict[str, Any] = {
    "name": "flaky",
    "agent": "flaky_agent:agent",
    "cases": [
        {
            "id": "steady",
            "goal": "say hi",
            "task_class": "chat",
            "model": [{"kind": "final", "answer": "hi"}],
            "expect": {"answer": {"equals": "hi"}},
        },
        {
            "id": "flaky",
            "goal": "say right",
            "task_class": "chat",
            "epochs": 2,
            "expect": {"answer": {"equals": "right"}},
        },
    ],
}


def test_rerun_failed_runs_only_the_failed_cases_again_and_counts_attempts(
    tmp_path: Path,
) -> None:
    """A model that answers what answer.txt says: wrong first, then right."""
    (tmp_path / "flaky_agent.py").write_text(FLAKY_AGENT)
    (tmp_path / "cases.json").write_text(json.dumps(FLAKY_CASES))
    (tmp_path / "answer.txt").write_text("wrong")
    url = f"sqlite:///{tmp_path / 'eval.db'}"

    printed: list[str] = []

    def evaluate(*extra: str) -> tuple[int, list[dict[str, Any]]]:
        result = run_cli("eval", "cases.json", "--json", "r.json", *extra, cwd=tmp_path, db=url)
        assert result.returncode in (0, 4), result.stderr
        printed.append(result.stdout)
        return result.returncode, read_report(tmp_path / "r.json")["cases"]

    code, first = evaluate()
    assert code == 4
    assert [(c["case_id"], c["status"], c["attempts"]) for c in first] == [
        ("steady", "passed", 1),
        ("flaky", "failed", 1),
        ("flaky", "failed", 1),
    ]
    (tmp_path / "answer.txt").write_text("right")
    code, plain = evaluate()  # without --rerun-failed: the recorded runs, nothing runs
    assert (code, plain) == (4, first)
    code, rerun = evaluate("--rerun-failed")
    assert code == 0
    assert [(c["case_id"], c["status"], c["attempts"]) for c in rerun] == [
        ("steady", "passed", 1),
        ("flaky", "passed", 2),
        ("flaky", "passed", 2),
    ]
    assert "flaky#2 (attempt 2)" in printed[-1]
    assert rerun[0] == first[0]  # the passed case was not run again
    assert [c["invocation_id"] for c in rerun[1:]] == [
        c["invocation_id"] + "-a2" for c in first[1:]
    ]
    code, once_more = evaluate("--rerun-failed")  # nothing failed: nothing runs
    assert (code, once_more) == (0, rerun)


async def test_cases_run_concurrently_in_one_runtime_with_group_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import loop_actors.store.journal as journal_module

    groups: list[int] = []
    original = journal_module.commit_group

    def counting(store: Any, group: list[Any], **options: Any) -> list[Any]:
        results = original(store, group, **options)
        groups.append(len(group))  # once written (a commit refused inline is written later)
        return results

    monkeypatch.setattr(journal_module, "commit_group", counting)
    running = 0
    most = 0

    async def answer(request: Any) -> dict[str, str]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await trio.sleep(0.02)
        running -= 1
        return {"kind": "final", "answer": "hi"}

    agent = Agent("many", ScriptedModel(answer))
    suite = Suite(
        agent="unused:agent",
        cases=[Case(id=f"c{n}", goal="say hi", task_class="chat") for n in range(12)],
    )
    with trio.fail_after(30):
        results = await run_jobs(
            Runtime(f"sqlite:///{tmp_path / 'eval.db'}"),
            suite_jobs(agent, suite, "many"),
            concurrency=4,
        )
    assert [r.status for r in results] == [CaseStatus.PASSED] * 12
    assert most == 4  # at most --concurrency at once, and that many
    # 12 starts and 12 finals, in fewer transactions than commits: one Journal for all.
    assert sum(groups) == 24
    assert max(groups) > 1


def test_builtin_with_a_cases_file_runs_both_in_one_report(tmp_path: Path) -> None:
    (tmp_path / "flaky_agent.py").write_text(FLAKY_AGENT)
    (tmp_path / "answer.txt").write_text("right")
    (tmp_path / "cases.json").write_text(json.dumps(FLAKY_CASES))
    url = f"sqlite:///{tmp_path / 'eval.db'}"
    result = run_cli("eval", "cases.json", "--builtin", "--json", "r.json", cwd=tmp_path, db=url)
    assert result.returncode == 0, result.stdout + result.stderr
    report = read_report(tmp_path / "r.json")
    assert report["suite"] == "flaky"
    assert [c["case_id"] for c in report["cases"]] == ["steady", "flaky", "flaky", *CASE_IDS]
    assert report["cases"][3]["invocation_id"].startswith("eval-builtin-direct-answer-e1-")


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ((), "eval needs a cases file, or --builtin"),
        (("cases.json", "--builtin-fault", "wrong_tool"), "--builtin-fault goes with --builtin"),
        (("--builtin", "--builtin-fault", "no_such_fault"), "invalid choice: 'no_such_fault'"),
        (("--builtin", "--agent", "flaky_agent:agent"), "--agent replaces a cases file's agent"),
        (("clash.json", "--builtin"), "case id(s) repeated-plan of clash.json are built-in"),
        (("--builtin", "--db", "memory://"), "memory:// is in memory; use a database file"),
    ],
)
def test_bad_builtin_command_lines_exit_2_and_write_nothing(
    tmp_path: Path, args: tuple[str, ...], problem: str
) -> None:
    """Bad inputs: no file and no --builtin, a fault without --builtin, an unknown fault,
    --agent without a file, a file case whose id is a built-in one, an in-memory store (the
    crash cases' subprocess could not open it)."""
    (tmp_path / "flaky_agent.py").write_text(FLAKY_AGENT)
    (tmp_path / "cases.json").write_text(json.dumps(FLAKY_CASES))
    clash = json.loads(json.dumps(FLAKY_CASES))
    clash["cases"][0]["id"] = "repeated-plan"
    (tmp_path / "clash.json").write_text(json.dumps(clash))
    db = None if "--db" in args else f"sqlite:///{tmp_path / 'eval.db'}"
    result = run_cli("eval", *args, cwd=tmp_path, db=db)
    assert result.returncode == 2
    assert problem in result.stderr
    assert not (tmp_path / "eval.db").exists()


def test_the_reference_lists_every_case_with_what_it_proves_and_every_fault() -> None:
    page = (Path(__file__).parents[2] / "docs/reference/eval-builtin.md").read_text()
    for case in builtin_suite().cases:
        assert f"| `{case.id}` | `{case.task_class}` | {case.proves} |" in page
    for fault in Fault:
        assert f"| `{fault.value}` | `{GUARDS[fault]}`: " in page
