"""The benchmarks still run against the current code (tiny sizes: no figure is checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize(
    ("script", "arguments", "expected"),
    [
        ("turn_overhead.py", ["--n", "3", "--reps", "1", "--calls", "3"], "kept open"),
        ("otel_overhead.py", ["--n", "3", "--reps", "1"], "tracing on (in-memory SDK)"),
        ("model_input_digests.py", ["--n", "3", "--reps", "1"], "ratio digests/turn"),
        ("stored_bytes.py", ["--n", "3", "--reps", "1"], "ratio JSON/packed bytes"),
        ("store_backends.py", ["--n", "2", "--concurrent", "3", "--reps", "1"], "sqlite     "),
        ("turn_breakdown.py", ["--n", "3", "--reps", "1"], "scheduler passes per turn"),
        ("turn_floor.py", ["--n", "3", "--reps", "1"], "floor, Journal thread"),
        ("turn_core_events.py", ["--n", "3", "--reps", "1"], "private-attribute set-ups"),
        ("concurrency.py", ["--n", "5", "--delay", "0.01"], "5/5 completed"),
        ("concurrency.py", ["--n", "4", "--delay", "0.01"], "spread of each round's model calls"),
        ("concurrency.py", ["--n", "4", "--delay", "0.01", "--tool", "inline"], "reads (inline)"),
        ("concurrency.py", ["--n", "3", "--delay", "0.05"], "before the first model reply"),
        (
            "resume_long_history.py",
            ["--turns", "5", "--reps", "1", "--check-reps", "1"],
            "history check",
        ),
        ("read_models.py", ["--n", "10", "--wave", "5", "--reps", "1"], "format 2 / encode"),
        ("read_models.py", ["--n", "12", "--rebuild-events", "200"], "rebuild of the three"),
        ("resume_check.py", ["--writes", "3", "--others", "0,5", "--reps", "1"], "scan/indexed"),
        ("mcp_sessions.py", ["--reps", "1"], "ratio per-call/one-session"),
        ("timers.py", ["--n", "50", "--sleep", "0.01", "--reps", "1"], "ratio trio.sleep/timers"),
        ("checkpoint_writes.py", ["--n", "20"], "20 in the directory"),
        ("machine_speed.py", [], "reference loop"),
        ("cli_startup.py", ["--reps", "1"], "loop-actors history ID"),
        ("bulk_submit.py", ["--goals", "5", "--processes", "1"], "ratio a goal a process"),
        ("eval_report.py", ["--n", "3", "--reps", "1"], "ratio eval_html/report"),
        ("worker_startup.py", ["--n", "20", "--reps", "1"], "median of the last first model call"),
        (
            "worker_throughput.py",
            ["--n", "6", "--delay", "0.01", "--workers", "1,2"],
            "6/6 completed with the right answer",
        ),
        (
            "worker_throughput.py",
            ["--n", "4", "--delay", "0.01", "--workers", "1", "--tool", "inline"],
            "4/4 completed with the right answer",
        ),
        (
            "workers.py",
            ["--n", "4", "--delay", "0.01", "--workers", "1", "--concurrency", "2", "--kill"],
            "recovery after SIGKILL",
        ),
        (
            "workers.py",
            [
                "--n",
                "2",
                "--delay",
                "0.01",
                "--workers",
                "1",
                "--concurrency",
                "2",
                "--kill",
                "--kills",
                "2",
            ],
            "recovery after 2 SIGKILLs of a random one of 3 workers",
        ),
    ],
)
def test_a_benchmark_runs_and_prints_its_figures(
    script: str, arguments: list[str], expected: str, tmp_path: Path
) -> None:
    finished = subprocess.run(
        [sys.executable, str(BENCH / script), *arguments, "--dir", str(tmp_path)]
        if script != "resume_long_history.py"
        else [sys.executable, str(BENCH / script), *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    assert expected in finished.stdout


@pytest.mark.parametrize(
    ("script", "arguments", "expected"),
    [
        ("concurrency.py", ["--n", "0"], "--n must be at least 1, not 0"),
        ("concurrency.py", ["--n", "3", "--delay", "-1"], "--delay must be a finite number"),
        ("concurrency.py", ["--n", "3", "--delay", "nan"], "--delay must be a finite number"),
        ("concurrency.py", ["--mode", "seq", "--db", "x.db", "--n", "0"], "--n must be at least 1"),
        ("worker_throughput.py", ["--n", "-2"], "--n must be at least 1, not -2"),
        ("worker_throughput.py", ["--n", "4", "--delay", "inf"], "--delay must be a finite"),
        ("worker_throughput.py", ["--n", "4", "--workers", "2,x"], "--workers must be whole"),
        (
            "worker_throughput.py",
            ["--n", "4", "--workers", "0"],
            "--workers must each be at least 1",
        ),
        ("checkpoint_writes.py", ["--n", "0"], "--n must be at least 1"),
    ],
)
def test_a_load_benchmark_refuses_a_workload_it_cannot_measure(
    script: str, arguments: list[str], expected: str, tmp_path: Path
) -> None:
    """Bad input: no invocations, a negative or non-finite latency, bad worker counts: exit 2
    with the reason, before anything runs (no traceback, no figures of nothing)."""
    finished = subprocess.run(
        [sys.executable, str(BENCH / script), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert finished.returncode == 2, finished.stdout + finished.stderr
    assert expected in finished.stderr
    assert "Traceback" not in finished.stderr
    assert finished.stdout == ""


def test_the_idle_figure_splits_a_wait_across_the_first_reply_between_its_two_sides() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from concurrency import idle_split  # a script of bench/, for this test
    finally:
        sys.path.remove(str(BENCH))
    waits = [(0.0, 1.0), (1.5, 1.0), (3.0, 0.5)]  # (start, seconds)
    assert idle_split(waits, 2.0) == (1.5, 1.0)  # 1 + 0.5 before; 0.5 + 0.5 after
    assert idle_split(waits, 0.0) == (0.0, 2.5)
    assert idle_split(waits, 10.0) == (2.5, 0.0)
    assert idle_split([], 1.0) == (0.0, 0.0)
