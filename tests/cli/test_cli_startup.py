"""The CLI's start-up: lazy imports, the public names, the entry points and ExitCode.

Which modules a command imports is checked here, in a fresh interpreter each (how long
it takes is ``bench/cli_startup.py``'s). Bad inputs tried: a name outside ``__all__``
(AttributeError); every command's and sub-command's ``--help``, as the parser lists
them (none may import trio, eventsourcing or pydantic); the options' literal defaults
and choices against the runtime's values they copy.
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

import aggregates
import loop_actors
import projections
from aggregates.decisions import TerminalReason
from aggregates.lease import DEFAULT_LEASE_S, QueueStatus
from aggregates.schedules import (
    DEFAULT_CATCH_UP,
    DEFAULT_OVERLAP,
    DEFAULT_TIME_ZONE,
    CatchUp,
    Overlap,
)
from loop_actors.audit import checkpointer
from loop_actors.cli import ExitCode, main
from loop_actors.cli import parser as cli_parser
from loop_actors.cli.options import evaluation, queue, read_models, schedules
from loop_actors.cli.parser import COMMANDS, build_parser, command_group, command_options
from loop_actors.eval.builtin import Fault
from loop_actors.workers import worker
from projections import default_projections
from projections.runner import DEFAULT_BATCH_SIZE
from tests.support.cli import cli_env, run_cli

PAYMENTS_APP = Path(__file__).parents[1] / "support" / "payments_app.py"

HEAVY = ("trio", "eventsourcing", "pydantic")
"""What ``--version`` and ``--help`` must not import."""

UNNEEDED = (
    "openai",
    "anthropic",
    "httpx",
    "mcp",
    "anyio",
    "asyncio",
    "jinja2",
    "jsonschema",
    "psycopg",
    "cryptography",
)
"""What none of ``import loop_actors``, ``--version``, ``history``, ``list`` and ``submit``
imports on a SQLite store: the provider SDKs, MCP, the asyncio bridge, the eval's pages and
schemas, PostgreSQL's driver, the cipher."""

RUNTIME = (
    "trio",
    "outcome",
    "loop_actors.runtime.runtime",
    "loop_actors.runtime.driver",
    "loop_actors.store.journal",
    "loop_actors.workers",
    "loop_actors.eval",
    "loop_actors.audit",
)
"""The runtime that runs invocations: ``history``, ``list`` and ``submit`` run none."""


def _imported_after(
    code: str, *, looked_for: Sequence[str] = HEAVY, cwd: Path | None = None
) -> list[str]:
    """Those of ``looked_for`` that a fresh interpreter has imported after running ``code``."""
    probe = (
        f"{code}\nimport sys, json\n"
        f"print(json.dumps([m for m in {list(looked_for)!r} if m in sys.modules]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    imported: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
    return imported


def _printed_by(probe: str) -> str:
    """What a fresh interpreter running ``probe`` prints."""
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env=cli_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return result.stdout


def _imported_by(argv: list[str], *, cwd: Path, looked_for: Sequence[str]) -> list[str]:
    """Those of ``looked_for`` that a fresh interpreter imported running ``loop-actors ARGV``."""
    code = (
        "import contextlib, io\n"
        "from loop_actors.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        f"        code = main({argv!r})\n"
        "    except SystemExit as exit_:  # --version\n"
        "        code = exit_.code or 0\n"
        "assert code == 0, code"
    )
    return _imported_after(code, looked_for=looked_for, cwd=cwd)


def test_importing_loop_actors_and_version_import_neither_the_models_nor_what_commands_skip() -> (
    None
):
    looked_for = [*HEAVY, *UNNEEDED, *RUNTIME, "rich", "importlib.metadata"]
    assert _imported_after("import loop_actors", looked_for=looked_for) == []
    assert _imported_by(["--version"], cwd=Path.cwd(), looked_for=looked_for) == []


@pytest.fixture(scope="module")
def submitted_project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A folder with an agent module and a store holding one submitted invocation."""
    project = tmp_path_factory.mktemp("startup")
    db = "sqlite:///run.db"
    shutil.copy(PAYMENTS_APP, project / "payments_app.py")
    (project / "goals.txt").write_text('pay bob 10\n{"goal": "pay carol", "id": "g-2"}\n', "utf-8")
    done = run_cli(
        "submit", "payments_app:agent", "--goal", "pay", "--id", "s-1", cwd=project, db=db
    )
    assert done.returncode == 0, done.stderr
    return project, db


@pytest.mark.parametrize(
    ("argv", "draws"),
    [
        (["history", "s-1"], False),
        (["history", "s-1", "--json"], False),
        (["list"], True),
        (["list", "--json"], True),
        (["submit", "payments_app:agent", "--goal", "pay again"], False),
        (["submit", "payments_app:agent", "--goals", "goals.txt"], False),
    ],
)
def test_history_list_and_submit_import_no_runtime_provider_sdk_or_postgresql(
    submitted_project: tuple[Path, str], argv: list[str], draws: bool
) -> None:
    """``draws``: the command renders a table with rich (``list``); the others print lines."""
    project, db = submitted_project
    looked_for = [*UNNEEDED, *RUNTIME, "rich"]
    imported = _imported_by([*argv, "--db", db], cwd=project, looked_for=looked_for)
    assert imported == (["rich"] if draws else [])


NOT_FOR_READING = (
    "loop_actors.store.queue",
    "aggregates.schedules",
    "aggregates.rate_limits",
    "projections.metrics",
    "projections.runner",
    "loop_actors.telemetry.otel",
)
"""What reading one invocation's history does without: the work queue and the vocabularies
of its rows, the read models, the telemetry."""

NOT_FOR_SUBMITTING = (
    "projections.metrics",
    "projections.runner",
    "loop_actors.telemetry.spans",
    "loop_actors._statistics",
    "loop_actors.agent.adapters",
)
"""What a submit of an agent whose model is an object (not a provider's name) does
without: the read models, the spans and the runtime's statistics (it asks only for the
current span), the providers' adapters."""


@pytest.mark.parametrize(
    ("argv", "unneeded", "needed"),
    [
        (["history", "s-1"], NOT_FOR_READING, []),
        (["history", "s-1", "--json"], NOT_FOR_READING, []),
        (["list"], NOT_FOR_READING[:3], ["projections.metrics", "projections.runner"]),
        (["submit", "payments_app:agent", "--goal", "pay"], NOT_FOR_SUBMITTING, []),
        (["submit", "payments_app:agent", "--goals", "goals.txt"], NOT_FOR_SUBMITTING, []),
    ],
)
def test_each_quick_command_imports_only_the_parts_of_the_store_it_uses(
    submitted_project: tuple[Path, str],
    argv: list[str],
    unneeded: Sequence[str],
    needed: list[str],
) -> None:
    """``needed``: looked for too, to show the probe sees what the command does import."""
    project, db = submitted_project
    looked_for = [*unneeded, *needed]
    imported = _imported_by([*argv, "--db", db], cwd=project, looked_for=looked_for)
    assert imported == needed


def test_the_function_metrics_keeps_its_name_when_its_module_is_imported_first() -> None:
    """``projections.metrics`` is the function, imported on first use, however it is reached."""
    probe = (
        "import sys, projections\n"
        "before = 'projections.metrics' in sys.modules\n"
        "import projections.metrics\n"
        "from projections import metrics\n"
        "from projections.metrics import MetricsProjection, metrics as defined\n"
        "print(before, projections.metrics is defined, metrics is defined, callable(metrics))"
    )
    assert _printed_by(probe).split() == ["False", "True", "True", "True"]


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_version_and_help_import_neither_trio_nor_eventsourcing_nor_pydantic(
    argv: list[str],
) -> None:
    code = (
        "import contextlib, io\nfrom loop_actors.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    main({argv!r})"
    )
    assert _imported_after(code) == []


def _every_command(parser: argparse.ArgumentParser, prefix: list[str]) -> list[list[str]]:
    """Each command and sub-command of ``parser``, as the words that name it."""
    parser.format_help()  # adds a command's lazy options, and with them its sub-commands
    found: list[list[str]] = []
    for action in parser._actions:  # argparse lists its sub-commands nowhere else
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append([*prefix, name])
                found += _every_command(sub, [*prefix, name])
    return found


def test_every_command_s_help_imports_neither_trio_nor_eventsourcing_nor_pydantic() -> None:
    """In one fresh interpreter, each ``<command> [<sub-command>] --help`` in turn."""
    commands = _every_command(build_parser(), [])
    assert len(commands) > len(COMMANDS)  # the sub-commands (audit verify, ...) are in
    probe = (
        "import contextlib, io, json, sys\n"
        "from loop_actors.cli import main\n"
        f"heavy = {HEAVY!r}\n"
        "found = {}\n"
        f"for words in {commands!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main([*words, '--help'])\n"
        "    found[' '.join(words)] = [m for m in heavy if m in sys.modules]\n"
        "print(json.dumps(found))"
    )
    printed = _printed_by(probe)
    imported: dict[str, list[str]] = json.loads(printed.strip().splitlines()[-1])
    assert list(imported) == [" ".join(words) for words in commands]
    assert {command: heavy for command, heavy in imported.items() if heavy} == {}


def test_the_options_literals_agree_with_the_runtime_values_they_copy() -> None:
    """The options modules write defaults and choices out; each equals its source."""
    assert [reason.value for reason in TerminalReason] == read_models.TERMINAL_REASONS
    assert [status.value for status in QueueStatus] == queue.QUEUE_STATUSES
    assert [fault.value for fault in Fault] == evaluation.BUILTIN_FAULTS
    assert [overlap.value for overlap in Overlap] == schedules.OVERLAPS
    assert [catch_up.value for catch_up in CatchUp] == schedules.CATCH_UPS
    assert (
        DEFAULT_OVERLAP.value,
        DEFAULT_CATCH_UP.value,
        DEFAULT_TIME_ZONE,
    ) == (schedules.DEFAULT_OVERLAP, schedules.DEFAULT_CATCH_UP, schedules.DEFAULT_TIME_ZONE)
    assert [model.name for model in default_projections()] == read_models.READ_MODELS
    assert read_models.DEFAULT_BATCH_SIZE == DEFAULT_BATCH_SIZE
    assert queue.DEFAULT_LEASE_S == DEFAULT_LEASE_S
    assert (queue.DEFAULT_CONCURRENCY, queue.DEFAULT_GRACE_S) == (
        worker.DEFAULT_CONCURRENCY,
        worker.DEFAULT_GRACE_S,
    )
    assert (
        cli_parser.CHECKPOINT_DIR_ENV,
        cli_parser.CHECKPOINT_KEY_ENV,
        cli_parser.CHECKPOINT_EVERY_ENV,
        cli_parser.DEFAULT_CHECKPOINT_EVERY,
    ) == (
        checkpointer.CHECKPOINT_DIR_ENV,
        checkpointer.CHECKPOINT_KEY_ENV,
        checkpointer.CHECKPOINT_EVERY_ENV,
        checkpointer.DEFAULT_CHECKPOINT_EVERY,
    )


def test_importing_loop_actors_imports_nothing_heavy_until_a_name_is_used() -> None:
    assert _imported_after("import loop_actors") == []
    assert "trio" in _imported_after("import loop_actors\nloop_actors.Runtime")


def test_jinja_is_imported_when_a_page_is_rendered_not_before() -> None:
    """``--version``, the HTML module itself and the report model leave Jinja unloaded."""
    probe = (
        "import contextlib, io, sys\nfrom loop_actors.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--version'])\n"
        "before = 'jinja2' in sys.modules\n"
        "import loop_actors.eval.html, loop_actors.eval.report, loop_actors.cli.evaluation\n"
        "imported = 'jinja2' in sys.modules\n"
        "loop_actors.eval.html._environment()\n"
        "print(before, imported, 'jinja2' in sys.modules)"
    )
    assert _printed_by(probe).split() == ["False", "False", "True"]


def test_every_public_name_resolves_to_the_object_of_its_module() -> None:
    for name in loop_actors.__all__:
        assert getattr(loop_actors, name) is not None, name
    assert loop_actors.ToolEffect is loop_actors.Effect  # the former name, kept
    assert set(loop_actors.__all__) <= set(dir(loop_actors))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        loop_actors.Nope  # noqa: B018 - the access is the test


@pytest.mark.parametrize(
    ("package", "eager"),
    [
        (loop_actors, set()),
        (aggregates, set()),
        (projections, {"default_projections"}),  # defined here
    ],
)
def test_the_lazy_table_and_the_type_checking_imports_agree_with_all(
    package: ModuleType, eager: set[str]
) -> None:
    """Each name is in ``__all__``, in ``_EXPORTS`` and in the TYPE_CHECKING block, once."""
    assert package.__file__ is not None
    tree = ast.parse(Path(package.__file__).read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    typed: dict[str, str] = {}
    for statement in block.body:
        assert isinstance(statement, ast.ImportFrom)
        assert statement.module is not None
        for alias in statement.names:
            assert alias.asname == alias.name  # a re-export, under its own name
            typed[alias.name] = statement.module
    exports = package._EXPORTS
    assert typed == exports
    assert sorted([*exports, *eager]) == sorted(package.__all__)
    assert len(package.__all__) == len(set(package.__all__))
    for name in package.__all__:
        assert getattr(package, name) is not None, name


def test_importing_a_plain_module_of_the_domain_builds_none_of_its_models() -> None:
    """``aggregates.values`` and the vocabularies alone: no pydantic, no eventsourcing.

    (``loop_actors._errors`` names the error classes of the vocabulary, and every error
    message goes through it.)
    """
    assert _imported_after("import aggregates.values, aggregates.vocabulary") == []
    assert _imported_after("import loop_actors._errors") == []


def test_every_command_has_its_group_and_its_options() -> None:
    for name, group, _ in COMMANDS:
        assert name in command_options(group).ARGUMENTS, (name, group)
        assert callable(command_group(group).run), group
    names = ",".join(name for name, _, _ in COMMANDS)
    assert f"{{{names}}}" in build_parser().format_usage()  # in this order


def test_exit_codes_keep_their_documented_numbers() -> None:
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0,
        "INTERNAL_ERROR": 1,
        "USAGE_ERROR": 2,
        "PAUSED": 3,
        "NOT_COMPLETED": 4,
        "NEEDS_PERSON": 5,
        "LEASE_HELD": 6,
        "INTERRUPTED": 130,
    }
    assert ExitCode["TAMPERED"] is ExitCode.NOT_COMPLETED  # one number, two meanings


def test_a_usage_error_in_process_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["list", "--limit", "0"])
    assert exited.value.code == ExitCode.USAGE_ERROR
    assert capsys.readouterr().err == (
        "loop-actors list: error: argument --limit: must be at least 1, got 0 (see --help)\n"
    )


@pytest.mark.parametrize("command", [["-m", "loop_actors"], ["-m", "loop_actors.cli.main"]])
def test_the_module_entry_points_print_the_version(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, *command, "--version"],
        env=cli_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("loop-actors ")
    assert result.stderr == ""  # no runpy warning of a module imported twice


def test_the_entry_point_works_after_the_main_module_was_imported(tmp_path: Path) -> None:
    """Importing ``loop_actors.cli.main`` rebinds the package's ``main`` to that module.

    A test module that imported it made every later ``from loop_actors.cli import main``
    get a module ("'module' object is not callable" in the hand-cut history test, in CI).
    """
    code = (
        "import sys\nimport loop_actors.cli.main\nfrom loop_actors.cli import main\n"
        f"sys.exit(main(['list', '--db', 'sqlite:///{tmp_path}/none.db']) + 40)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 42, done.stderr  # list's usage error (no such store): 2
    assert "no database" in done.stderr
