"""The log chain and the checkpoints with several writer processes on one PostgreSQL store."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from loop_actors import StoreUrlError
from loop_actors.store.url import StoreUrl
from tests.support.cli import cli_env, run_cli


def _postgres_urls_supported() -> bool:
    try:
        StoreUrl.parse("postgresql://user@127.0.0.1:5432/db")
    except StoreUrlError:
        return False
    return True


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not _postgres_urls_supported(), reason="this tree's store has no PostgreSQL recorder yet"
    ),
]

WRITER = textwrap.dedent(
    """
    import sys
    import trio
    from loop_actors import Runtime
    from tests.support.audit import AGENT

    url, folder, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    async def main() -> None:
        async with Runtime(url, checkpoint_dir=folder, checkpoint_every=3) as runtime:
            async with trio.open_nursery() as nursery:
                for n in range(count):
                    nursery.start_soon(
                        lambda n=n: runtime.run(AGENT, "refund", invocation_id=f"{name}-{n}")
                    )

    trio.run(main)
    """
)


def verify(folder: Path, url: str, *args: str) -> tuple[int, list[dict[str, Any]]]:
    result = run_cli(
        "audit", "verify", "--json", "--no-state", *args, cwd=folder, db=url, timeout=120
    )
    return result.returncode, [json.loads(line) for line in result.stdout.splitlines()]


def test_several_writer_processes_on_postgresql_give_one_log_chain_that_verifies(
    postgres_url: str, tmp_path: Path
) -> None:
    """Four processes, each running six invocations at once (each with a write, so effects
    too) on one PostgreSQL database and writing checkpoints into one directory while the
    others commit: the chain of checkpoints is whole, the log gives every checkpoint's head
    (notification ids are in commit order under eventsourcing's table lock), and the last
    checkpoint covers every row. Bad input: none; then the last row deleted by hand, which
    the last checkpoint finds (truncated)."""
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, postgres_url, str(tmp_path / "cps"), name, "6"],
            cwd=Path(__file__).resolve().parents[2],
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("w1", "w2", "w3", "w4")
    ]
    for writer in writers:
        _, err = writer.communicate(timeout=180)
        assert writer.returncode == 0, err
    code, reports = verify(tmp_path, postgres_url, "--checkpoint-dir", "cps")
    assert code == 0, [
        r for r in reports if r.get("verdict", "ok") != "ok" or r.get("intact") is False
    ]
    coverage = next(r for r in reports if r["kind"] == "coverage")
    assert coverage["invocations"] == 24
    checkpoints = [r for r in reports if r["kind"] == "checkpoint"]
    assert len(checkpoints) >= 4
    assert all(r["verdict"] == "ok" for r in checkpoints)
    assert max(r["size"] for r in checkpoints) == coverage["rows"]

    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute(
            "DELETE FROM loopactors_events WHERE notification_id = "
            "(SELECT MAX(notification_id) FROM loopactors_events)"
        )
    code, reports = verify(tmp_path, postgres_url, "--checkpoint-dir", "cps")
    assert code == 4
    last = max((r for r in reports if r["kind"] == "checkpoint"), key=lambda r: r["size"])
    assert (last["verdict"], last["position"]) == ("truncated", coverage["rows"])
