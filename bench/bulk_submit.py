"""Submitting a batch: one ``submit --goals FILE`` process against one ``submit`` process a goal.

Issue 32: "submitting a batch has no better way than one process per goal" (50 ``submit``
processes took 94 s on a loaded machine). The script submits, to a fresh store each:

- ``--processes`` goals (50), one ``loop-actors submit MODULE:ATTR --goal G --id I``
  process each, one after the other;
- ``--goals`` goals (1,000) with one ``loop-actors submit MODULE:ATTR --goals FILE``
  (JSON lines with ids; one transaction a chunk of 500), then the same file again (every
  goal already submitted: nothing is written but the rows' check);
- the same goals from Python, ``Runtime.submit_many`` in one open runtime (in this
  process, no start-up).

It prints the wall time of each, per goal, and the ratio of a goal's cost in one process
each to a goal's in the file. ``--db postgresql://...`` (a database the script may fill)
runs them on PostgreSQL instead of a SQLite file in ``--dir``.

    python bench/bulk_submit.py [--goals 1000] [--processes 50] [--dir /tmp] [--db URL]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cli_startup import AGENT_MODULE  # noqa: E402
from machine_speed import describe as describe_machine  # noqa: E402

from loop_actors import Runtime, Submission  # noqa: E402

CREATED: list[str] = []
"""The PostgreSQL databases this run made (dropped at its end)."""


def fresh_url(folder: Path, name: str, postgres: str | None) -> str:
    """A new, empty store: a SQLite file in ``folder``, or a new PostgreSQL database."""
    if postgres is None:
        return f"sqlite:///{folder / f'{name}.db'}"
    import psycopg

    database = f"bulk_{name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{database}"')
    CREATED.append(database)
    return postgres.rsplit("/", 1)[0] + f"/{database}"


def drop_created(postgres: str) -> None:
    """Drop the databases :func:`fresh_url` made."""
    import psycopg

    with psycopg.connect(postgres, autocommit=True) as connection:
        for database in CREATED:
            connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def cli(folder: Path, env: dict[str, str], *args: str) -> float:
    """Seconds of one ``loop-actors`` process."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "loop_actors", *args],
        cwd=folder,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--goals", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=50)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--db", default=None, help="a PostgreSQL server URL (admin)")
    args = parser.parse_args()
    if args.goals < 1 or args.processes < 1:
        parser.error("--goals and --processes must be at least 1")
    print(describe_machine())
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        (folder / "bulk_agent.py").write_text(AGENT_MODULE, encoding="utf-8")  # nothing runs
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOP_ACTORS_")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package's cached bytecode
        env["PYTHONPYCACHEPREFIX"] = str(folder / "bytecode")
        cli(folder, env, "--version")  # writes the bytecode, untimed
        cli(folder, env, "submit", "bulk_agent:agent", "--goal", "warm", "--db", "sqlite:///w.db")

        url = fresh_url(folder, "one_each", args.db)
        one_each = 0.0
        for n in range(args.processes):
            goal = ["--goal", f"goal {n}", "--id", f"p-{n}", "--db", url]
            one_each += cli(folder, env, "submit", "bulk_agent:agent", *goal)

        lines = [json.dumps({"goal": f"goal {n}", "id": f"g-{n:06d}"}) for n in range(args.goals)]
        (folder / "goals.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        url = fresh_url(folder, "file", args.db)
        bulk = ["submit", "bulk_agent:agent", "--goals", "goals.jsonl", "--db", url]
        file_once = cli(folder, env, *bulk)
        file_again = cli(folder, env, *bulk)

        sys.path.insert(0, str(folder))
        agent = importlib.import_module("bulk_agent").agent  # written above

        url = fresh_url(folder, "python", args.db)
        goals = [Submission(f"goal {n}", invocation_id=f"g-{n:06d}") for n in range(args.goals)]

        async def in_python() -> float:
            async with Runtime(url) as runtime:
                started = time.perf_counter()
                await runtime.submit_many(agent, goals)
                return time.perf_counter() - started

        python_s = trio.run(in_python)
        if args.db is not None:
            drop_created(args.db)

    store = "PostgreSQL" if args.db else "SQLite"
    per_process = one_each / args.processes
    per_goal = file_once / args.goals
    print(f"store: {store}")
    print(
        f"{args.processes} `submit` processes, one goal each: {one_each:.2f} s "
        f"({per_process * 1000:.1f} ms a goal)"
    )
    print(
        f"`submit --goals` of {args.goals} goals: {file_once:.2f} s ({per_goal * 1000:.2f} ms a "
        f"goal), again (all already submitted): {file_again:.2f} s"
    )
    print(
        f"Runtime.submit_many of {args.goals} goals in an open runtime: {python_s:.2f} s "
        f"({python_s / args.goals * 1000:.2f} ms a goal)"
    )
    print(f"ratio a goal a process / a goal of the file: {per_process / per_goal:.0f}x")


if __name__ == "__main__":
    main()
