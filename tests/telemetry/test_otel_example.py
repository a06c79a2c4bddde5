"""docs/examples/otel_traces.py runs, and prints the trace the how-to shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.docs import ROOT

EXAMPLE = ROOT / "docs" / "examples" / "otel_traces.py"

PRINTED = """\
one trace: True
  POST /refunds          parent=None
  invoke_agent refunds   parent=POST /refunds        paused
  chat gpt-4.1-mini      parent=invoke_agent refunds
  invoke_agent refunds   parent=POST /refunds        ended
  execute_tool refund    parent=invoke_agent refunds
  chat gpt-4.1-mini      parent=invoke_agent refunds
runs: completed 1
"""


def test_the_otel_example_prints_one_trace_of_two_drives_under_the_applications_span(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOP_ACTORS_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == PRINTED
    assert PRINTED in (ROOT / "docs" / "how-to" / "send-traces-and-metrics.md").read_text()
