"""What starting a command costs: ``import loop_actors`` and the quick CLI commands.

Each figure is the time of a new process running the command, less the time of
``python -c pass`` measured in the same round (issue 32's targets: ``import
loop_actors`` at most 0.15 s more, ``loop-actors --version`` 0.05 s, ``history ID``,
``list`` and ``submit`` 0.25 s). The rounds run the commands in turn, REPS times; the
script prints, for each, the median and the least difference of wall time and of the
process's CPU time (user + system), and its target. A shared machine's load moves the
wall times: the CPU times, and the reference printed first (``machine_speed.py``), tell
a slow moment from a fast one.

The store (untimed) holds one invocation that ran two steps (``history`` reads it; ``list``
catches its read models up with each round's new invocations, in the views file the
first round made); each ``submit`` records one new invocation. The agent module imports
only ``loop_actors``' public names, as a user's would. The commands run as ``python -m
loop_actors``, from this checkout (its root on ``PYTHONPATH``, ahead of an editable
install of another), with bytecode cached in a folder of their own (``PYTHONPYCACHEPREFIX``,
written by a first untimed round), as an installed package has it
(``PYTHONDONTWRITEBYTECODE`` would compile every module of the package at every start
instead: ``--no-bytecode`` measures that).

    python bench/cli_startup.py [--reps 15] [--dir /tmp] [--no-bytecode]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine_speed import describe as describe_machine  # noqa: E402

AGENT_MODULE = textwrap.dedent(
    '''
    """The benchmark's agent: one lookup, then an answer."""
    from loop_actors import Agent, ScriptedModel, tool


    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"


    def decide(request):
        if not request.results:
            call = {"id": "c1", "name": "lookup", "arguments": {"key": request.goal}}
            return {"kind": "tool_calls", "calls": [call]}
        return {"kind": "final", "answer": str(request.results[0].output)}


    agent = Agent("startup-bench", ScriptedModel(decide), [lookup])
    '''
)

TARGETS = {
    "import loop_actors": 0.15,
    "loop-actors --version": 0.05,
    "loop-actors history ID": 0.25,
    "loop-actors list": 0.25,
    "loop-actors submit": 0.25,
}
"""Issue 32's targets: seconds more than ``python -c pass``."""


def prepare(folder: Path) -> tuple[str, str]:
    """The store's URL and the id of the invocation it holds (run once, untimed)."""
    (folder / "startup_agent.py").write_text(AGENT_MODULE, encoding="utf-8")
    url = f"sqlite:///{folder / 'startup.db'}"
    ran = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, '.')\n"
            "from loop_actors import Runtime\nfrom startup_agent import agent\n"
            f"print(Runtime({url!r}).run_sync(agent, 'colour', invocation_id='ran-1').reason)",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    )
    assert ran.stdout.strip() == "completed", ran.stdout
    return url, "ran-1"


def commands(url: str, invocation_id: str, round_: int) -> dict[str, list[str]]:
    """Each measured command line (``submit`` records a new goal each round)."""
    cli = [sys.executable, "-m", "loop_actors"]
    goal = f"goal {round_}"
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import loop_actors": [sys.executable, "-c", "import loop_actors"],
        "loop-actors --version": [*cli, "--version"],
        "loop-actors history ID": [*cli, "history", invocation_id, "--db", url],
        "loop-actors list": [*cli, "list", "--db", url],
        "loop-actors submit": [*cli, "submit", "startup_agent:agent", "--goal", goal, "--db", url],
    }


def timed(argv: list[str], folder: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, cwd=folder, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--no-bytecode", action="store_true")
    args = parser.parse_args()
    if args.reps < 1:
        parser.error(f"--reps must be at least 1, not {args.reps}")
    print(describe_machine())
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOP_ACTORS_")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(folder / "bytecode")
        if args.no_bytecode:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
            env.pop("PYTHONPYCACHEPREFIX")
        # The agent's folder, then this checkout: the commands run this tree's code (an
        # editable install of another checkout would answer otherwise).
        env["PYTHONPATH"] = os.pathsep.join([str(folder), str(HERE.parent)])
        url, invocation_id = prepare(folder)
        for argv in commands(url, invocation_id, -1).values():  # writes the bytecode
            timed(argv, folder, env)
        walls: dict[str, list[float]] = {}
        cpus: dict[str, list[float]] = {}
        passes: list[float] = []
        for round_ in range(args.reps):
            measured = {
                name: timed(argv, folder, env)
                for name, argv in commands(url, invocation_id, round_).items()
            }
            base_wall, base_cpu = measured["python -c pass"]
            passes.append(base_wall)
            for name, (wall, cpu) in measured.items():
                walls.setdefault(name, []).append(wall - base_wall)
                cpus.setdefault(name, []).append(cpu - base_cpu)
        bytecode = "compiled at every start" if args.no_bytecode else "cached"
        print(
            f"{args.reps} rounds, bytecode {bytecode}; `python -c pass` took "
            f"{statistics.median(passes):.3f} s (median); each command, seconds more than "
            "it in the same round (median / least):"
        )
        print(f"{'command':<24} {'wall':>15} {'CPU':>15} {'target':>8}")
        for name, target in TARGETS.items():
            wall_s, cpu_s = walls[name], cpus[name]
            verdict = "✓" if statistics.median(wall_s) <= target else "✗"
            print(
                f"{name:<24} {statistics.median(wall_s):6.3f} / {min(wall_s):6.3f} "
                f"{statistics.median(cpu_s):6.3f} / {min(cpu_s):6.3f} {target:>6.2f} {verdict}"
            )


if __name__ == "__main__":
    main()
