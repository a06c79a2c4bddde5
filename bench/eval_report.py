"""What an eval run and its reports cost: cases per second, then the report's parts.

Runs a suite of N scripted cases (a batch of two parallel reads, a write, a final
answer checked by a regex and an argument match) in one Runtime on a SQLite file
in ``--dir``, at ``--concurrency`` at once; then times, REPS times each, the JSON
report (``report``), its HTML page (``eval_html``), a compare of the report with
the same runs with latencies shifted by 0 to 6 ms (``compare``, which includes the
paired bootstraps) and its HTML page (``compare_html``), and prints each output's
size per case.

    python bench/eval_report.py [--n 500] [--concurrency 8] [--reps 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from loop_actors import Agent, Runtime, ScriptedModel, tool
from loop_actors.eval.evaluate import Suite, compare, report, run_suite
from loop_actors.eval.html import compare_html, eval_html
from loop_actors.eval.report import EvalReport, document_json


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool(effect="write")
def send(to: str) -> str:
    """Send a message."""
    return f"sent to {to}"


AGENT = Agent("bench", ScriptedModel([{"kind": "final", "answer": "unscripted"}]), [lookup, send])


def _suite(n: int) -> Suite:
    turns: list[dict[str, Any]] = [
        {
            "kind": "tool_calls",
            "calls": [
                {"id": "a", "name": "lookup", "arguments": {"key": "x"}},
                {"id": "b", "name": "lookup", "arguments": {"key": "y"}},
            ],
        },
        {"kind": "tool_calls", "calls": [{"id": "w", "name": "send", "arguments": {"to": "ops"}}]},
        {"kind": "final", "answer": "the values are x and y"},
    ]
    expect = {
        "reason": "completed",
        "answer": {"regex": "values"},
        "tools": {"match": [{"tool": "lookup", "arguments": {"key": "x"}}]},
        "effects": {"committed": ["send"]},
    }
    return Suite.model_validate(
        {
            "name": "bench",
            "agent": "bench:agent",
            "cases": [
                {
                    "id": f"case-{i}",
                    "goal": f"goal {i}",
                    "task_class": f"class-{i % 4}",
                    "model": turns,
                    "expect": expect,
                }
                for i in range(n)
            ],
        }
    )


def _timed(reps: int, work: Callable[[], Any]) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(reps):
        started = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(dir=args.dir))
    suite = _suite(args.n)
    runtime = Runtime(f"sqlite:///{folder / 'eval.db'}")
    started = time.perf_counter()
    results = trio.run(
        lambda: run_suite(runtime, AGENT, suite, "bench", concurrency=args.concurrency)
    )
    ran = time.perf_counter() - started
    assert all(r.status.value == "passed" for r in results), [r.failures for r in results][:3]
    n = len(results)
    print(f"{n} cases run in {ran:.2f} s: {n / ran:.0f} cases/s at concurrency {args.concurrency}")

    report_s, document = _timed(args.reps, lambda: report("bench", AGENT, results))
    text = document_json(document)
    html_s, page = _timed(args.reps, lambda: eval_html(document))
    loaded = EvalReport.model_validate_json(text)
    # B: the same runs with latencies shifted by 0 to 6 ms, so the bootstrap has work to do.
    shifted = loaded.model_copy(
        update={
            "cases": [
                case.model_copy(update={"latency_ms": case.latency_ms + index % 7})
                for index, case in enumerate(loaded.cases)
            ]
        }
    )
    compare_s, comparison = _timed(args.reps, lambda: compare(loaded, shifted))
    compare_html_s, side_by_side = _timed(
        args.reps, lambda: compare_html(comparison, loaded, shifted)
    )
    for name, seconds, output in (
        ("report (JSON)", report_s, text),
        ("eval_html", html_s, page),
        ("compare (with bootstraps)", compare_s, document_json(comparison)),
        ("compare_html", compare_html_s, side_by_side),
    ):
        print(
            f"{name:26} {seconds * 1000:8.1f} ms  {seconds / n * 1e6:7.1f} µs/case  "
            f"{len(output.encode()) / n / 1024:6.2f} KiB/case"
        )
    print(f"ratio eval_html/report {html_s / report_s:.2f}")


if __name__ == "__main__":
    main()
