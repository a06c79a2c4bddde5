"""The ``loop-actors`` command.

Exit codes: 0 completed, 3 paused, 4 any other terminal reason, 2 bad usage or
input (nothing written), 1 internal error, 6 another process holds the
invocation's lease (``resume --take-over`` fences it off); ``reconcile``: 0 nothing
waits, 3 the sweeper will retry something, 5 an effect needs a person (``effects
resolve``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import trio
from rich.console import Console

from aggregates.audit import (
    AUDIT_FORMAT,
    GENESIS,
    StoredForm,
    canonical_record,
    event_body,
    record_data,
    split_stored,
    topic_of,
)
from aggregates.decisions import TerminalReason
from aggregates.effect import who_settles
from aggregates.invocation import InvocationEvent
from aggregates.lease import QueueRow
from aggregates.values import check_json_depth, describe_error
from loop_actors._errors import (
    AgentLoadError,
    EffectResolutionError,
    InconsistentHistoryError,
    InvocationNotFoundError,
    LeaseHeldError,
    UsageError,
)
from loop_actors._render import (
    effects_table,
    invocations_table,
    metrics_table,
    render_tree,
    terminal_safe,
)
from loop_actors.agent.adapters import model_from_name
from loop_actors.agent.agent import Agent
from loop_actors.audit.checkpoint import (
    CheckpointReport,
    Commitment,
    LogHead,
    Verdict,
    check_signature,
    checkpoint_note,
    generate_key,
    load_signing_key,
    load_verifier_key,
    log_head,
    parse_checkpoint,
    verify_log,
)
from loop_actors.audit.checkpointer import (
    CHECKPOINT_DIR_ENV,
    CHECKPOINT_EVERY_ENV,
    CHECKPOINT_KEY_ENV,
    Checkpointer,
    CheckpointSettings,
    DirectoryMark,
    verify_directory,
)
from loop_actors.audit.store_copy import copy_store
from loop_actors.audit.verified_state import (
    default_state_path,
    load_state,
    next_state,
    save_state,
)
from loop_actors.audit.verify import Coverage, verify_all, verify_invocation
from loop_actors.cli.demo import DEMO_GOAL, demo_agent
from loop_actors.cli.queue import (
    QUEUE_STATUSES,
    add_queue_commands,
    check_submit,
    make_worker,
    queue_statuses,
    status_of,
    submit_command,
    worker_command,
    workers_command,
)
from loop_actors.eval import evaluate as evaluation
from loop_actors.eval.builtin import SUITE_NAME, Fault, builtin_jobs, crash_store_problem
from loop_actors.eval.html import compare_html, eval_html
from loop_actors.eval.progress import case_progress, progress_wanted
from loop_actors.runtime.controller import single_exception
from loop_actors.runtime.outcome import Outcome
from loop_actors.runtime.runtime import Runtime, check_invocation_id, unaskable_reason
from loop_actors.store.store import (
    EventStore,
    redacted_url,
    resolve_db_url,
)
from loop_actors.store.views import open_read_runner, open_writable_runner
from projections import (
    ProjectionRunner,
    build_trajectory,
    list_invocations,
    list_open_effects,
    load_trajectory,
    metrics,
)
from projections.runner import DEFAULT_BATCH_SIZE

EXIT_USAGE = 2
EXIT_INTERNAL = 1
EXIT_NEEDS_PERSON = 5
EXIT_LEASE_HELD = 6
"""Another process holds a live lease on the invocation: nothing ran (``--take-over``)."""
EXIT_TAMPERED = 4
"""The store's history is not the one written: audit verify found a break, or resume refused."""
"""``reconcile``: an open effect that only a person can settle is left (``effects resolve``)."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _version() -> str:
    try:
        return importlib.metadata.version("loop-actors")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree never installed
        return "(not installed)"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def checkpoint_options(sub: argparse.ArgumentParser) -> None:
    """The options of every command that runs invocations: automatic checkpoints."""
    sub.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help=f"write checkpoints of the log to DIR, outside the store (${CHECKPOINT_DIR_ENV})",
    )
    sub.add_argument(
        "--checkpoint-key",
        metavar="KEYFILE",
        help=f"sign them with this private key file (${CHECKPOINT_KEY_ENV})",
    )
    sub.add_argument(
        "--checkpoint-every",
        metavar="N",
        type=_positive_int,
        help=f"and after every N commits when no run ends (${CHECKPOINT_EVERY_ENV}; default 100)",
    )


def runtime_for(args: argparse.Namespace, *, existing: bool = False) -> Runtime:
    """The Runtime a command runs invocations with: ``--db`` and the checkpoint options.

    With ``existing``, the database must exist already (resume and reconcile create
    nothing). A checkpoint key file is read here, before anything runs.

    Raises:
        UsageError: a bad option, a missing database, or an unreadable key file.
    """
    url = resolve_db_url(getattr(args, "db", None))
    runtime = Runtime(
        url,
        checkpoint_dir=getattr(args, "checkpoint_dir", None),
        checkpoint_key=getattr(args, "checkpoint_key", None),
        checkpoint_every=getattr(args, "checkpoint_every", None),
    )
    if runtime.checkpoints is not None and runtime.checkpoints.key_file is not None:
        load_signing_key(runtime.checkpoints.key_file)
    if existing:
        EventStore(url, create=False).close()
    return runtime


DB_HELP = "sqlite:///path.db, postgresql://user:password@host:port/dbname or memory://"


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="loop-actors",
        description="Run, inspect and audit event-sourced agent loops.",
        epilog="Database: --db URL, else $LOOP_ACTORS_DB, else sqlite:///loop-actors.db. "
        "Exit codes: 0 completed, 3 paused, 4 other terminal reason, 2 bad usage, 1 internal, "
        "6 another process holds the lease; reconcile: 5 an effect needs a person.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def db_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--db", metavar="URL", help=DB_HELP)

    demo = commands.add_parser("demo", help="run seed 000's example agent and show its trajectory")
    db_option(demo)
    checkpoint_options(demo)

    run = commands.add_parser("run", help="run an Agent given as MODULE:ATTR")
    run.add_argument("agent", metavar="MODULE:ATTR", help="e.g. myagents:support_agent")
    run.add_argument("--goal", required=True, help="what the agent should achieve")
    run.add_argument("--id", dest="invocation_id", metavar="ID", help="choose the invocation id")
    run.add_argument("--task-class", help="recorded with the invocation, for metrics")
    run.add_argument(
        "--model", metavar="PROVIDER:MODEL", help="run with openai:MODEL or anthropic:MODEL instead"
    )
    run.add_argument(
        "--base-url", metavar="URL", help="an OpenAI-compatible server (vLLM, Ollama...)"
    )
    run.add_argument(
        "--send-key-to-loopback",
        action="store_true",
        help="send the provider key from the environment to a --base-url on this machine too "
        "(a local gateway that needs it; withheld by default)",
    )
    run.add_argument("--actor", help="who the invocation acts for (for the agent's policy)")
    run.add_argument("--tenant", help="whose data it acts on (for the agent's policy)")
    run.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    db_option(run)
    checkpoint_options(run)

    resume = commands.add_parser(
        "resume", help="continue an invocation from its committed events (after a crash or pause)"
    )
    resume.add_argument("invocation_id", metavar="ID")
    resume.add_argument("--agent", required=True, metavar="MODULE:ATTR", help="the agent it runs")
    resume.add_argument(
        "--allow-catalogue-change",
        action="store_true",
        help="resume even if a tool was removed or changed its schema since the start",
    )
    resume.add_argument(
        "--allow-settings-change",
        action="store_true",
        help="use the agent's current budget and settings instead of the recorded ones "
        "(recorded as SettingsChanged)",
    )
    resume.add_argument(
        "--take-over",
        action="store_true",
        help="resume even while another process holds its lease: that holder is fenced off "
        "(LeaseAcquired is recorded; its next append is refused, it ends lease_lost)",
    )
    resume.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    db_option(resume)
    checkpoint_options(resume)

    approve = commands.add_parser("approve", help="approve the batch an invocation waits with")
    approve.add_argument("invocation_id", metavar="ID")
    approve.add_argument("--digest", required=True, help="the digest the paused run printed")
    approve.add_argument("--by", required=True, metavar="NAME", help="who approves (audited)")
    approve.add_argument("--note", help="why (audited)")
    approve.add_argument("--agent", metavar="MODULE:ATTR", help="resume right away with it")
    approve.add_argument("--json", action="store_true")
    db_option(approve)
    checkpoint_options(approve)

    deny = commands.add_parser("deny", help="deny the batch an invocation waits with")
    deny.add_argument("invocation_id", metavar="ID")
    deny.add_argument("--by", required=True, metavar="NAME", help="who denies (audited)")
    deny.add_argument("--reason", required=True, help="why (audited, and told to the model)")
    deny.add_argument("--agent", metavar="MODULE:ATTR", help="resume right away with it")
    deny.add_argument("--json", action="store_true")
    db_option(deny)
    checkpoint_options(deny)

    clarify = commands.add_parser("clarify", help="answer the question an invocation asked")
    clarify.add_argument("invocation_id", metavar="ID")
    clarify.add_argument("--answer", required=True, help="the answer the model will see")
    clarify.add_argument("--by", metavar="NAME", help="who answers (audited)")
    clarify.add_argument("--agent", metavar="MODULE:ATTR", help="resume right away with it")
    clarify.add_argument("--json", action="store_true")
    db_option(clarify)
    checkpoint_options(clarify)

    cancel = commands.add_parser(
        "cancel", help="ask an invocation to stop (recorded; honoured by any worker)"
    )
    cancel.add_argument("invocation_id", metavar="ID")
    cancel.add_argument("--by", metavar="NAME", help="who asks (audited)")
    cancel.add_argument("--reason", help="why (audited)")
    cancel.add_argument("--json", action="store_true")
    db_option(cancel)
    checkpoint_options(cancel)

    reconcile = commands.add_parser(
        "reconcile",
        help="settle open effects with their services; resume invocations paused for it",
    )
    reconcile.add_argument("--agent", required=True, metavar="MODULE:ATTR")
    reconcile.add_argument("--json", action="store_true", help="print a JSON report")
    db_option(reconcile)
    checkpoint_options(reconcile)

    audit = commands.add_parser("audit", help="verify the tamper-evident history")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True, parser_class=_Parser)
    verify = audit_commands.add_parser(
        "verify", help="check the hash chains of one invocation (and its effects) or of all"
    )
    verify.add_argument("invocation_id", metavar="ID", nargs="?", help="default: every stored row")
    verify.add_argument("--json", action="store_true", help="one JSON report a line")
    verify.add_argument(
        "--against", metavar="FILE", help="also check the log against this checkpoint note"
    )
    verify.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="also check DIR's chain of checkpoints, and the log against each of them",
    )
    verify.add_argument(
        "--key", metavar="KEYFILE.pub", help="the verifier key the checkpoints must be signed with"
    )
    state = verify.add_mutually_exclusive_group()
    state.add_argument(
        "--state",
        metavar="FILE",
        help="the last-verified state to check against and update (default: "
        "$XDG_STATE_HOME/loop-actors/verified/STORE-ID.json)",
    )
    state.add_argument(
        "--no-state", action="store_true", help="neither read nor write a last-verified state"
    )
    db_option(verify)
    checkpoint = audit_commands.add_parser(
        "checkpoint", help="write the log's size and head as a (signed) C2SP checkpoint note"
    )
    checkpoint.add_argument("--key", metavar="KEYFILE", help="sign with this private key file")
    where = checkpoint.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="FILE", help="write the note here (default: stdout)")
    where.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="add it to DIR's chain of checkpoints (as the runtime's --checkpoint-dir does)",
    )
    db_option(checkpoint)
    keygen = audit_commands.add_parser(
        "keygen", help="write a new Ed25519 signing key file and KEYFILE.pub beside it"
    )
    keygen.add_argument("--out", metavar="KEYFILE", required=True, help="the private key file")
    keygen.add_argument(
        "--name", default="loop-actors", help="the key's name (default: loop-actors)"
    )

    store = commands.add_parser("store", help="copy a store (e.g. from SQLite to PostgreSQL)")
    store_commands = store.add_subparsers(dest="store_command", required=True, parser_class=_Parser)
    copy = store_commands.add_parser(
        "copy",
        help="copy every event (with its id, in order) and snapshot into an empty store, "
        "then check that its audit and log head equal the source's",
    )
    copy.add_argument("--from", dest="source", metavar="URL", required=True, help=DB_HELP)
    copy.add_argument("--to", dest="target", metavar="URL", required=True, help=DB_HELP)
    copy.add_argument("--json", action="store_true", help="print the report as JSON")

    def views_option(sub: argparse.ArgumentParser) -> None:
        db_option(sub)
        sub.add_argument(
            "--views", metavar="FILE", help="the read models' SQLite file (default: X.views.db)"
        )

    show = commands.add_parser("show", help="an invocation's trajectory, as a tree")
    show.add_argument("invocation_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="the trajectory as JSON")
    views_option(show)

    listing = commands.add_parser("list", help="invocations, newest first")
    listing.add_argument(
        "--reason",
        choices=[reason.value for reason in TerminalReason],
        metavar="REASON",
        help="only this terminal reason (e.g. completed)",
    )
    listing.add_argument("--agent", help="only this agent")
    listing.add_argument(
        "--status",
        choices=QUEUE_STATUSES,
        help="only invocations in this state of the work queue (runnable, claimed, paused, ended)",
    )
    listing.add_argument(
        "--limit", type=_positive_int, default=50, help="at most this many (default 50)"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object a line")
    views_option(listing)

    metrics_cmd = commands.add_parser("metrics", help="counts and distributions by group")
    metrics_cmd.add_argument(
        "--by", choices=["agent", "task-class", "reason"], default="reason", help="the grouping"
    )
    metrics_cmd.add_argument("--json", action="store_true", help="one JSON object a line")
    views_option(metrics_cmd)

    effects_cmd = commands.add_parser(
        "effects",
        help="open effects (dispatched or outcome unknown), oldest first; "
        "'effects resolve KEY' settles one by hand",
    )
    _effects_list_options(effects_cmd, views_option, default=None)
    effect_actions = effects_cmd.add_subparsers(
        dest="effects_command", required=False, parser_class=_Parser
    )
    effects_list = effect_actions.add_parser(
        "list", help="open effects, oldest first, and who can settle each (the default)"
    )
    # SUPPRESS: options given before `list` are not reset by the sub-command's defaults.
    _effects_list_options(effects_list, views_option, default=argparse.SUPPRESS)
    resolve = effect_actions.add_parser(
        "resolve",
        help="settle an open effect by hand: the write happened (--committed) or not "
        "(--rejected); who and why are recorded",
    )
    resolve.add_argument("effect_key", metavar="KEY", help="the effect key (eff-...)")
    happened = resolve.add_mutually_exclusive_group(required=True)
    happened.add_argument(
        "--committed", action="store_true", help="the write happened (give its --receipt)"
    )
    happened.add_argument(
        "--rejected", action="store_true", help="the write did not happen (give a --reason)"
    )
    resolve.add_argument(
        "--receipt", metavar="JSON", help="with --committed: the service's receipt, as JSON"
    )
    resolve.add_argument(
        "--reason",
        metavar="TEXT",
        help="why (audited); required with --rejected (the model sees it)",
    )
    resolve.add_argument("--by", required=True, metavar="NAME", help="who settles it (audited)")
    resolve.add_argument(
        "--agent",
        dest="effects_agent",
        metavar="MODULE:ATTR",
        default=argparse.SUPPRESS,
        help="the invocation's agent: the receipt is redacted as its tool says "
        "(sensitive_output), and a paused invocation is resumed right away; without it "
        "the receipt is stored as given",
    )
    resolve.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print what was recorded"
    )
    resolve.add_argument("--db", metavar="URL", default=argparse.SUPPRESS, help=DB_HELP)
    checkpoint_options(resolve)

    projections_cmd = commands.add_parser("projections", help="the read models")
    projection_actions = projections_cmd.add_subparsers(
        dest="projections_command", required=True, parser_class=_Parser
    )
    for action, text in (
        ("status", "position, head and lag of each read model"),
        ("catch-up", "apply every event not yet applied"),
        ("rebuild", "drop a read model and replay it from position 0"),
    ):
        sub_parser = projection_actions.add_parser(action, help=text)
        sub_parser.add_argument(
            "name", nargs="?", choices=["trajectory", "metrics", "open_effects"]
        )
        sub_parser.add_argument("--json", action="store_true", help="one JSON object a line")
        sub_parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"events per transaction (default {DEFAULT_BATCH_SIZE})",
        )
        views_option(sub_parser)

    evaluate = commands.add_parser(
        "eval",
        help="run a cases file's cases as invocations and score their trajectories "
        "('eval schema', 'eval compare A B')",
    )
    evaluate.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        help="a cases file (JSON or YAML), or 'schema', or 'compare' (optional with --builtin)",
    )
    evaluate.add_argument("more", metavar="REPORT", nargs="*", help="compare: the two reports")
    evaluate.add_argument(
        "--concurrency", type=_positive_int, default=8, help="cases run at once (default 8)"
    )
    evaluate.add_argument("--json", dest="json_report", metavar="REPORT", help="write the report")
    evaluate.add_argument(
        "--html",
        dest="html_report",
        metavar="REPORT",
        help="write the report as one self-contained HTML page (charts, trajectories)",
    )
    evaluate.add_argument(
        "--builtin",
        action="store_true",
        help="also run the built-in cases (seed 000's branches: a self-test of the runtime)",
    )
    evaluate.add_argument(
        "--rerun-failed",
        action="store_true",
        help="run the cases whose last attempt failed again, as new attempts",
    )
    evaluate.add_argument(  # checking the checks: break what one built-in case guards
        "--builtin-fault",
        dest="builtin_faults",
        action="append",
        default=[],
        choices=[fault.value for fault in Fault],
        help=argparse.SUPPRESS,
    )
    evaluate.add_argument(
        "--agent",
        dest="eval_agent",
        metavar="MODULE:ATTR",
        help="run this agent instead of the file's (change one thing, re-measure)",
    )
    db_option(evaluate)
    checkpoint_options(evaluate)

    add_queue_commands(commands, db_option, _positive_int)
    checkpoint_options(commands.choices["worker"])

    history = commands.add_parser("history", help="print an invocation's committed events")
    history.add_argument("invocation_id", metavar="ID")
    history.add_argument("--json", action="store_true", help="one JSON object a line")
    db_option(history)
    return parser


def _effects_list_options(sub: argparse.ArgumentParser, views_option: Any, *, default: Any) -> None:
    """The options of ``effects`` and ``effects list`` (``default``: SUPPRESS on the latter)."""
    sub.add_argument(
        "--agent",
        dest="effects_agent",
        metavar="MODULE:ATTR",
        help="look at this agent's tools: a write whose tool has no reconcile needs a person",
        **({} if default is None else {"default": default}),
    )
    if default is None:
        sub.add_argument("--json", action="store_true", help="one JSON object a line")
        views_option(sub)
        return
    sub.add_argument("--json", action="store_true", default=default, help="one JSON object a line")
    sub.add_argument("--db", metavar="URL", default=default, help=DB_HELP)
    sub.add_argument(
        "--views",
        metavar="FILE",
        default=default,
        help="the read models' SQLite file (default: X.views.db)",
    )


def load_agent(reference: str) -> Agent:
    """Import ``MODULE:ATTR`` (like uvicorn) and check that it is an Agent.

    Raises:
        AgentLoadError: the module or attribute is missing, or is not an Agent.
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise AgentLoadError(f"expected MODULE:ATTR, got {reference!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise AgentLoadError(f"cannot import module {module_name!r}: {error}") from error
    except Exception as error:
        raise AgentLoadError(
            f"importing {module_name!r} failed: {type(error).__name__}: {error}"
        ) from error
    value: Any = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise AgentLoadError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(value, Agent):
        raise AgentLoadError(f"{reference} is a {type(value).__name__}, not a loop_actors.Agent")
    return value


def _outcome_json(outcome: Outcome) -> str:
    record: dict[str, Any] = {
        "invocation_id": outcome.invocation_id,
        "reason": outcome.reason.value,
        "answer": outcome.answer,
        "steps": outcome.steps,
        "tool_calls": outcome.tool_calls,
        "detail": outcome.detail,
    }
    if outcome.digest is not None:
        record["digest"] = outcome.digest
        record["pending_calls"] = outcome.pending_calls
    return json.dumps(record)


def _outcome_lines(outcome: Outcome, events: int) -> list[str]:
    """The readable outcome; model and tool text escaped for the terminal."""
    lines = [outcome.reason.value]
    if outcome.answer is not None:
        lines.append(terminal_safe(outcome.answer))
    elif outcome.detail:
        lines.append(terminal_safe(outcome.detail))
    lines.append(
        f"steps={outcome.steps} tool_calls={outcome.tool_calls} events={events} "
        f"id={terminal_safe(outcome.invocation_id)}"
    )
    return lines


def event_record(
    event: InvocationEvent, previous_hash: str, form: StoredForm | None = None
) -> dict[str, Any]:
    """One history line: the event's record, its chain hash and the previous one.

    ``position`` is the event's place in its invocation. For an event of audit format 1,
    ``data`` is the canonical data that the hash covers; for format 2 the line also
    has ``format``, ``topic`` and ``stored``, the body exactly as stored (``form``, the
    row as read), which is what the hash covers (see ``aggregates.audit``). Either way
    the export can be verified without this package.
    """
    record = canonical_record(event)
    if getattr(event, "audit_format", None) == AUDIT_FORMAT:
        split = split_stored(form.state) if form is not None else None
        body = split[1] if split is not None else event_body(event)
        record["data"], record["timestamp"] = record_data(json.loads(body))
        record["format"] = AUDIT_FORMAT
        record["topic"] = form.topic if form is not None else topic_of(type(event))
        record["stored"] = body.decode()
    record["invocation_id"] = event.originator_id
    record["hash"] = event.chain_hash
    record["previous_hash"] = previous_hash
    return record


def _event_line(event: InvocationEvent) -> str:
    record = event_record(event, "")
    data = json.dumps(record["data"], separators=(",", ":"), sort_keys=True)
    if len(data) > 160:
        data = data[:159] + "…"
    return terminal_safe(
        f"{record['position']:>4}  {record['timestamp']}  {record['type']:<18} {data}"
    )


async def _run_agent(runtime: Runtime, agent: Agent, args: argparse.Namespace) -> int:
    async with runtime:  # one store for the run and its history (memory:// included)
        outcome = await runtime.run(
            agent,
            args.goal,
            invocation_id=args.invocation_id,
            task_class=args.task_class,
            actor=args.actor,
            tenant=args.tenant,
        )
        events = await runtime.history(outcome.invocation_id)
    return _report(outcome, len(events), as_json=args.json)


def _report(outcome: Outcome, event_count: int, *, as_json: bool) -> int:
    """Print an outcome (one JSON object, or the readable lines); return its exit code."""
    if as_json:
        print(_outcome_json(outcome))
    else:
        print("\n".join(_outcome_lines(outcome, event_count)))
    return outcome.exit_code


async def _demo(runtime: Runtime) -> int:
    async with runtime:
        outcome = await runtime.run(demo_agent, DEMO_GOAL)
        events = await runtime.history(outcome.invocation_id)
    print("\n".join(_outcome_lines(outcome, len(events))))
    print()
    # The same fold and the same tree as `loop-actors show` of this invocation.
    _console().print(render_tree(build_trajectory(events)))
    print()
    print(
        f"history: loop-actors history {outcome.invocation_id} --db {redacted_url(runtime.db_url)}"
    )
    return outcome.exit_code


async def _resume(runtime: Runtime, agent: Agent, args: argparse.Namespace) -> int:
    async with runtime:
        outcome = await runtime.resume(
            args.invocation_id,
            agent,
            allow_catalogue_change=args.allow_catalogue_change,
            allow_settings_change=args.allow_settings_change,
            take_over=args.take_over,
        )
        events = await runtime.history(outcome.invocation_id)
    return _report(outcome, len(events), as_json=args.json)


async def _reconcile(runtime: Runtime, agent: Agent, args: argparse.Namespace) -> int:
    report = await runtime.reconcile(agent)
    if args.json:
        print(report.model_dump_json())
    else:
        for outcome in report.resumed:
            print(f"resumed {terminal_safe(outcome.invocation_id)}: {outcome.reason.value}")
        for invocation_id in report.left_running:
            print(
                f"left alone {terminal_safe(invocation_id)}: not paused (it may be running); "
                "resume it"
            )
        for stuck in report.needs_person:
            print(
                f"needs a person {stuck.effect_key} "
                f"(invocation {terminal_safe(stuck.invocation_id)}): "
                f"{terminal_safe(stuck.why)}; loop-actors effects resolve {stuck.effect_key} "
                "--committed [--receipt JSON] | --rejected --reason TEXT --by NAME"
            )
        print(f"effects settled={report.effects_settled} open={report.effects_open}")
    if report.needs_person:
        return EXIT_NEEDS_PERSON
    # A resumed invocation paused for reconciliation has its open effects counted above.
    paused_again = any(
        o.paused and o.reason is not TerminalReason.RECONCILIATION_REQUIRED for o in report.resumed
    )
    return 3 if report.effects_waiting > 0 or paused_again else 0


def parse_receipt(text: str | None) -> Any:
    """The ``--receipt`` JSON (None when not given).

    Raises:
        EffectResolutionError: not JSON, or NaN / Infinity (not stored faithfully).
    """
    if text is None:
        return None

    def refuse(constant: str) -> NoReturn:
        raise EffectResolutionError(
            f"--receipt: {constant} is not JSON and cannot be stored faithfully"
        )

    problem = check_json_depth(text)  # before parsing: no RecursionError on deep nesting
    if problem is not None:
        raise EffectResolutionError(f"--receipt cannot be stored as JSON: {problem}")
    try:
        return json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as error:
        raise EffectResolutionError(f"--receipt is not JSON: {error}") from None


async def _resolve_effect(runtime: Runtime, agent: Agent | None, args: argparse.Namespace) -> int:
    """Record a person's resolution; with the agent, resume the invocation if it waits for it."""
    receipt = parse_receipt(args.receipt)
    async with runtime:
        resolved = await runtime.resolve_effect(
            args.effect_key,
            committed=args.committed,
            rejected=args.rejected,
            receipt=receipt,
            reason=args.reason,
            by=args.by,
            agent=agent,
        )
        if agent is None and args.receipt is not None:
            print(
                "loop-actors: note: without --agent the receipt is stored as given "
                "(the tool's sensitive_output is not applied)",
                file=sys.stderr,
            )
        line = (
            f"resolved {resolved.effect_key} {resolved.resolution.value} by {resolved.by} "
            f"(invocation {resolved.invocation_id}, tool {resolved.tool})"
        )
        if agent is not None and resolved.resumable:
            outcome = await runtime.resume(resolved.invocation_id, agent)
            events = await runtime.history(outcome.invocation_id)
            if not args.json:
                print(line)
            return _report(outcome, len(events), as_json=args.json)
    if args.json:
        print(resolved.model_dump_json())
        return 0
    print(line)
    if resolved.resumable:
        print(
            f"resume it to continue: loop-actors resume {resolved.invocation_id} "
            "--agent MODULE:ATTR"
        )
    else:
        print("its invocation has ended: nothing to resume")
    return 0


async def _decide(runtime: Runtime, agent: Agent | None, args: argparse.Namespace) -> int:
    """Approve / deny / clarify: record the person's decision, then resume if asked."""
    async with runtime:
        match args.command:
            case "approve":
                await runtime.approve(
                    args.invocation_id, digest=args.digest, by=args.by, note=args.note
                )
            case "deny":
                await runtime.deny(args.invocation_id, by=args.by, reason=args.reason)
            case _:
                await runtime.clarify(args.invocation_id, answer=args.answer, by=args.by)
        if agent is None:
            print(
                f"recorded {args.command} for {terminal_safe(args.invocation_id)}; "
                "resume it to continue"
            )
            return 0
        outcome = await runtime.resume(args.invocation_id, agent)
        events = await runtime.history(outcome.invocation_id)
    return _report(outcome, len(events), as_json=args.json)


async def _cancel(runtime: Runtime, args: argparse.Namespace) -> int:
    result = await runtime.request_cancel(args.invocation_id, by=args.by, reason=args.reason)
    if args.json:
        print(json.dumps({"invocation_id": args.invocation_id, "result": result.value}))
    else:
        print(f"{terminal_safe(args.invocation_id)}: {result.value}")
    return 0


def _note(text: str) -> None:
    print(f"loop-actors: note: {text}", file=sys.stderr)


def _open_for_reading(db: str | None) -> EventStore:
    """The store, opened read-only: the commands that only read never write it."""
    store = EventStore(resolve_db_url(db), create=False, read_only=True)
    for text in store.notes:
        _note(text)
    return store


def _history(args: argparse.Namespace) -> int:
    store = _open_for_reading(args.db)
    forms: dict[int, StoredForm] = {}
    try:
        events = store.events(args.invocation_id)
        if args.json:
            store.stored_entries(args.invocation_id, forms=forms)
    finally:
        store.close()
    previous = GENESIS
    for event in events:
        if args.json:
            record = event_record(event, previous, forms.get(event.originator_version))
            print(json.dumps(record, ensure_ascii=False))
        else:
            print(_event_line(event))
        previous = event.chain_hash
    return 0


def _read_models(args: argparse.Namespace) -> int:
    """The commands that read the read models (after catching them up)."""
    batch_size = getattr(args, "batch_size", DEFAULT_BATCH_SIZE)
    if batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    store = _open_for_reading(args.db)
    try:
        if args.command == "projections":
            runner = open_writable_runner(store, args.views, batch_size=batch_size)
        else:
            runner = open_read_runner(store, args.views, batch_size=batch_size, note=_note)
        queue = None
        if args.command == "list" and args.status is not None:
            queue = queue_statuses(store)
        try:
            return _read_model_command(runner, args, queue)
        finally:
            runner.close()
    finally:
        store.close()


def _console() -> Console:
    # A pipe or a file gets wide lines rather than columns cut to 80 characters.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _read_model_command(
    runner: ProjectionRunner,
    args: argparse.Namespace,
    queue: tuple[dict[str, QueueRow], float] | None = None,
) -> int:
    console = _console()
    if args.command == "projections":
        action = args.projections_command
        if action == "rebuild":
            reports = runner.rebuild(args.name)
        elif action == "catch-up":
            reports = runner.catch_up(args.name)
        else:
            for status in runner.status(args.name):
                if args.json:
                    print(json.dumps({**status.model_dump(), "lag": status.lag}))
                else:
                    print(
                        f"{status.name:<14} position={status.position} head={status.head} "
                        f"lag={status.lag}"
                    )
            return 0
        for report in reports:
            if args.json:
                print(report.model_dump_json())
            else:
                rate = report.events / report.seconds if report.seconds else 0.0
                print(
                    f"{report.name:<14} applied={report.events} position={report.position} "
                    f"({rate:,.0f} events/s)"
                )
        return 0
    runner.catch_up()
    match args.command:
        case "show":
            trajectory = load_trajectory(runner, args.invocation_id)
            if trajectory is None:
                raise InvocationNotFoundError(args.invocation_id)
            if args.json:
                print(trajectory.model_dump_json())
            else:
                console.print(render_tree(trajectory))
        case "list":
            if queue is None:
                rows = list_invocations(
                    runner, reason=args.reason, agent=args.agent, limit=args.limit
                )
            else:
                rows = _with_status(runner, args, *queue)
            if args.json:
                for row in rows:
                    print(json.dumps(row))
            else:
                console.print(invocations_table(rows))
        case "metrics":
            groups = metrics(runner, args.by)
            if args.json:
                for group in groups:
                    print(group.model_dump_json())
            else:
                console.print(metrics_table(groups, args.by))
        case "effects":
            effects = list_open_effects(runner)
            if args.effects_agent is not None:
                _who_settles_with(load_agent(args.effects_agent), effects)
            if args.json:
                for effect in effects:
                    print(json.dumps(effect))
            else:
                console.print(effects_table(effects))
    return 0


def _with_status(
    runner: ProjectionRunner, args: argparse.Namespace, rows: dict[str, QueueRow], now: float
) -> list[dict[str, Any]]:
    """``list --status``: the invocations in that queue state, newest first, with it."""
    found: list[dict[str, Any]] = []
    for row in list_invocations(runner, reason=args.reason, agent=args.agent, limit=2**62):
        status = status_of(rows.get(row["invocation_id"]), row["status"], now)
        if status == args.status:
            found.append({**row, "queue_status": status})
            if len(found) == args.limit:
                break
    return found


def _who_settles_with(agent: Agent, effects: list[dict[str, Any]]) -> None:
    """Say who settles each open effect of ``agent``'s invocations, looking at its tools."""
    for row in effects:
        if row["agent"] != agent.name:
            continue  # another agent's tools decide for its effects
        row["needs"] = who_settles(
            invocation_ended=row["invocation_ended"],
            service_can_be_asked=unaskable_reason(agent, row["tool"]) is None,
        ).value


def _audit_keygen(args: argparse.Namespace) -> int:
    private, public = Path(args.out), Path(args.out + ".pub")
    for path in (private, public):
        if path.exists():
            raise UsageError(f"{path} exists: keys are never overwritten")
    key = generate_key(args.name)
    try:
        descriptor = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(key.encoded())
        public.write_text(key.verifier().encoded(), encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write the key files: {error}") from error
    print(f"wrote {private} (keep it secret) and {public} (give it to verifiers)")
    return 0


def _audit_checkpoint(args: argparse.Namespace) -> int:
    key = load_signing_key(Path(args.key)) if args.key else None
    store = _open_for_reading(args.db)
    try:
        if args.checkpoint_dir:
            settings = CheckpointSettings(
                Path(args.checkpoint_dir), Path(args.key) if args.key else None
            )
            written = Checkpointer(store, settings).write()
            if written is None:
                print(f"{args.checkpoint_dir}: its last checkpoint covers every row already")
            else:
                print(f"wrote {written}{'' if key else ' (unsigned)'}")
            return 0
        size, head = log_head(store)
        note = checkpoint_note(f"loop-actors/{store.store_id}", size, head, key)
    finally:
        store.close()
    if args.out:
        try:
            Path(args.out).write_text(note, encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write {args.out}: {error}") from error
        print(f"checkpoint of {size} rows, head {head}{'' if key else ' (unsigned)'}: {args.out}")
    else:
        sys.stdout.write(note)
    return 0


_SIGNED = {
    "verified": "signature verified",
    "not checked": "signature not checked (no --key)",
    "unsigned": "unsigned",
    "bad": "bad signature",
    "local": "last verified",
}


def _log_line(report: CheckpointReport) -> str:
    """One text line for a finding (or the ``ok``) of the log, a checkpoint or a directory."""
    verdict = f"{report.verdict.value:<9}"
    problem = f": {report.problem}" if report.problem else ""
    if report.kind == "log":
        if report.ok:
            return f"{verdict} log        size={report.store_size} head={report.head}"
        return f"{verdict} log        at notification {report.position}{problem}"
    if report.kind == "checkpoint_chain":
        where = f"at checkpoint {report.position}" if report.position else "chained"
        return f"{verdict} checkpoints {report.source}  {where}{problem}"
    label = "verified  " if report.signed == "local" else "checkpoint"
    signed = _SIGNED.get(report.signed or "", "")
    return (
        f"{verdict} {label} {report.source}  size={report.size} store={report.store_size}  "
        f"{signed}{problem}"
    )


def _audit_verify(args: argparse.Namespace) -> int:
    if args.key and not (args.against or args.checkpoint_dir):
        raise UsageError("--key goes with --against FILE or --checkpoint-dir DIR")
    verifier = load_verifier_key(Path(args.key)) if args.key else None
    found: list[CheckpointReport] = []
    commitments: list[Commitment] = []
    if args.against:
        checkpoint = parse_checkpoint(Path(args.against))
        signed, bad = check_signature(checkpoint, verifier, args.against)
        if bad is not None:
            found.append(bad)
        else:
            commitments.append(
                Commitment(
                    args.against, checkpoint.origin, checkpoint.size, checkpoint.head, signed
                )
            )
    store = _open_for_reading(args.db)
    coverage: Coverage | None = None
    head: LogHead | None = None
    state_path: Path | None = None
    marks: dict[Path, DirectoryMark | None] = {}
    directory_sources: list[str] = []
    try:
        whole = not args.invocation_id
        if whole and not args.no_state and store.store_id is not None:
            state_path = Path(args.state) if args.state else default_state_path(store.store_id)
        state = load_state(state_path, store.store_id or "") if state_path else None
        if state is not None:
            commitments.append(
                Commitment(
                    str(state_path),
                    f"loop-actors/{state.store_id}",
                    state.size,
                    state.head,
                    "local",
                )
            )
        if args.checkpoint_dir:
            directory = Path(args.checkpoint_dir)
            chain, of_directory, mark = verify_directory(
                directory, verifier, state.mark(directory) if state else None
            )
            found += chain
            commitments += of_directory
            directory_sources = [commitment.source for commitment in of_directory]
            marks[directory] = mark
            if not chain:
                found.append(
                    CheckpointReport(
                        kind="checkpoint_chain",
                        verdict=Verdict.OK,
                        source=str(directory),
                        store_size=0,
                        problem=None,
                    )
                )
        if args.invocation_id:
            reports = verify_invocation(store, args.invocation_id)
        else:
            reports, coverage = verify_all(store)
        if whole or commitments:
            of_log, head = verify_log(store, commitments)
            found += of_log
    finally:
        store.close()
    for report in reports:
        if args.json:
            print(report.model_dump_json())
        elif report.intact:
            detail = (
                f"version={report.events}"
                if report.kind == "snapshot"
                else f"events={report.events}  head={report.head_hash}"
            )
            print(f"ok      {report.kind:<10} {terminal_safe(report.id)}  {detail}")
        else:
            where = f"at position {report.broken_at}: " if report.broken_at is not None else ""
            if report.kind == "snapshot":
                where = f"version {report.broken_at}: "
            print(terminal_safe(f"BROKEN  {report.kind:<10} {report.id}  {where}{report.problem}"))
    broken = [r for r in reports if not r.intact]
    uncovered = coverage is not None and coverage.rows + coverage.snapshots != coverage.store_rows
    if args.json:
        if coverage is not None:
            print(coverage.model_dump_json())
    else:
        print(f"{len(reports) - len(broken)} intact, {len(broken)} broken")
        if coverage is not None:
            print(
                f"every stored row checked: {coverage.rows} events of {coverage.invocations} "
                f"invocations, {coverage.effects} effects and {coverage.cancel_requests} cancel "
                f"requests; {coverage.snapshots} snapshots"
            )
            if uncovered:
                print(
                    f"BROKEN  the store holds {coverage.store_rows} rows, "
                    f"{coverage.rows + coverage.snapshots} were checked"
                )
    if head is not None and not any(r.kind == "log" for r in found):
        found.insert(
            0,
            CheckpointReport(
                kind="log",
                verdict=Verdict.OK,
                source="log",
                size=head.size,
                store_size=head.size,
                head=head.head,
            ),
        )
    # In text, a directory's checkpoints that agree are summed up by its last one.
    quiet = set(directory_sources[:-1])
    for finding in found:
        if args.json:
            print(finding.model_dump_json())
        elif finding.kind == "checkpoint_chain" and finding.ok:
            count = len(directory_sources)
            many = f"{count} checkpoints, the last one below" if count != 1 else "1 checkpoint"
            print(terminal_safe(f"{_log_line(finding)}: {many}"))
        elif not (finding.ok and finding.source in quiet):
            print(terminal_safe(_log_line(finding)))
    findings = [finding for finding in found if not finding.ok]
    if not (broken or uncovered or findings) and state_path is not None and head is not None:
        assert store.store_id is not None
        try:
            save_state(
                state_path,
                next_state(state, store.store_id, head, marks),
            )
        except OSError as error:
            print(
                f"loop-actors: warning: cannot save the last-verified state {state_path}: "
                f"{error}; the next verify cannot check that the log only grew",
                file=sys.stderr,
            )
    return EXIT_TAMPERED if broken or uncovered or findings else 0


def _store_copy(args: argparse.Namespace) -> int:
    """``store copy --from URL --to URL``: exit 0 when the copy equals its source, else 4."""
    report = copy_store(args.source, args.target, progress=None if args.json else _copied)
    if args.json:
        print(report.model_dump_json())
    else:
        print(
            f"copied {report.copied} rows"
            + (f" after the {report.already} already there" if report.already else "")
            + f" and {report.snapshots} snapshots"
            + (f" and {report.secrets} sealed secrets" if report.secrets else "")
            + f" from {report.source} to {report.target}"
        )
        same = "the same as the source's" if report.same_as_source else "NOT the source's"
        print(f"log: {report.size} rows, head {report.head} ({same})")
        print(f"audit of the copy: {report.intact} intact, {report.broken} broken")
    return 0 if report.ok else EXIT_TAMPERED


def _copied(rows: int) -> None:
    if rows % 10_000 == 0:
        print(f"loop-actors: {rows} rows copied", file=sys.stderr)


def _open_existing(db: str | None) -> Runtime:
    """A runtime on a database that must already exist (resume and reconcile create nothing)."""
    url = resolve_db_url(db)
    EventStore(url, create=False).close()
    return Runtime(url)


def _trio_run(fn: Callable[..., Awaitable[int]], *args: Any) -> int:
    """Run a command's trio loop; a Ctrl-C reaches its main task at a checkpoint only.

    So a real Ctrl-C never lands inside a tool's or a model's own code (which would
    make it that code's failure): it stops the command, exit 130.
    """
    return trio.run(fn, *args, restrict_keyboard_interrupt_to_checkpoints=True)


def _dispatch(args: argparse.Namespace) -> int:
    match args.command:
        case "demo":
            return _trio_run(_demo, runtime_for(args))
        case "run":
            if not args.goal.strip():
                raise UsageError("--goal must not be empty")
            if args.invocation_id is not None:
                check_invocation_id(args.invocation_id)  # before the database is opened
            agent = load_agent(args.agent)  # before the database: a bad agent writes nothing
            if args.model:
                model = model_from_name(
                    args.model,
                    base_url=args.base_url,
                    send_key_to_loopback=args.send_key_to_loopback,
                )
                agent = agent.with_model(model)
            elif args.base_url or args.send_key_to_loopback:
                raise UsageError("--base-url and --send-key-to-loopback go with --model")
            return _trio_run(_run_agent, runtime_for(args), agent, args)
        case "resume":
            agent = load_agent(args.agent)
            return _trio_run(_resume, runtime_for(args, existing=True), agent, args)
        case "submit":
            check_submit(args)
            agent = load_agent(args.agent)  # before the database: a bad agent writes nothing
            return _trio_run(submit_command, Runtime(args.db), agent, args)
        case "worker":
            worker = make_worker(args, [load_agent(reference) for reference in args.agents])
            checkpoints = worker.runtime.checkpoints
            if checkpoints is not None and checkpoints.key_file is not None:
                load_signing_key(checkpoints.key_file)  # before anything runs
            return trio.run(worker_command, worker, args)
        case "workers":
            store = _open_for_reading(args.db)
            try:
                return workers_command(store, args)
            finally:
                store.close()
        case "cancel":
            return _trio_run(_cancel, runtime_for(args, existing=True), args)
        case "approve" | "deny" | "clarify":
            decider = load_agent(args.agent) if args.agent else None
            return _trio_run(_decide, runtime_for(args, existing=True), decider, args)
        case "reconcile":
            agent = load_agent(args.agent)
            return _trio_run(_reconcile, runtime_for(args, existing=True), agent, args)
        case "history":
            return _history(args)
        case "audit" if args.audit_command == "keygen":
            return _audit_keygen(args)
        case "audit" if args.audit_command == "checkpoint":
            return _audit_checkpoint(args)
        case "audit":
            return _audit_verify(args)
        case "effects" if args.effects_command == "resolve":
            agent_ref = getattr(args, "effects_agent", None)
            resolver = load_agent(agent_ref) if agent_ref else None
            parse_receipt(args.receipt)  # before the database: a bad receipt opens nothing
            return trio.run(_resolve_effect, runtime_for(args, existing=True), resolver, args)
        case "store":
            return _store_copy(args)
        case "eval":
            return _eval_command(args)
        case "show" | "list" | "metrics" | "effects" | "projections":
            return _read_models(args)
        case _:  # argparse only accepts the commands above
            raise UsageError(f"unknown command {args.command!r}")


def _eval_command(args: argparse.Namespace) -> int:
    """``eval FILE``, ``eval schema`` and ``eval compare A B`` (see docs/reference/eval.md)."""
    if args.file == "schema":
        if args.more:
            raise UsageError("eval schema takes no other argument")
        print(json.dumps(evaluation.schema(), indent=2))
        return 0
    if args.file == "compare":
        if len(args.more) != 2:
            raise UsageError("eval compare needs two reports: eval compare A.json B.json")
        for target in (args.json_report, args.html_report):
            if target:
                evaluation.check_writable(Path(target))
        first, second = (evaluation.load_report(Path(p)) for p in args.more)
        comparison = evaluation.compare(first, second)
        if args.json_report:
            evaluation.write_json(Path(args.json_report), comparison)
        if args.html_report:
            page = compare_html(
                comparison,
                first.model_dump(mode="json"),
                second.model_dump(mode="json"),
                names=(Path(args.more[0]).name, Path(args.more[1]).name),
            )
            evaluation.write_text(Path(args.html_report), page)
        evaluation.print_table(evaluation.compare_table(comparison))
        return 0 if comparison["broke"] == 0 else 4
    if args.more:
        raise UsageError(f"eval takes one cases file, got {len(args.more) + 1}")
    if args.file is None and not args.builtin:
        raise UsageError("eval needs a cases file, or --builtin")
    if args.builtin_faults and not args.builtin:
        raise UsageError("--builtin-fault goes with --builtin")
    if args.eval_agent and args.file is None:
        raise UsageError("--agent replaces a cases file's agent: give the file")
    jobs: list[evaluation.Job] = []
    name, agent = SUITE_NAME, None
    if args.file is not None:
        path = Path(args.file)
        suite = evaluation.load_suite(path)  # before the database: a bad file writes nothing
        name = evaluation.suite_name(suite, path)
        checks = evaluation.import_checks(suite, str(path))
        reference = args.eval_agent or suite.agent
        agent = (
            load_agent(reference)
            if reference
            else Agent("eval", model_from_name(suite.model or ""))
        )
        evaluation.check_fakes(suite, agent, str(path))
        jobs = evaluation.suite_jobs(agent, suite, name, checks)
    if args.builtin:
        problem = crash_store_problem(resolve_db_url(args.db))
        if problem is not None:
            raise UsageError(problem)
        builtin = builtin_jobs(Fault(fault) for fault in args.builtin_faults)
        clash = sorted({job.case.id for job in jobs} & {job.case.id for job in builtin})
        if clash:
            raise UsageError(
                f"case id(s) {', '.join(clash)} of {args.file} are built-in case ids: rename them"
            )
        jobs += builtin
        agent = agent or builtin[0].agent
    assert agent is not None  # a file or --builtin, checked above
    for target in (args.json_report, args.html_report):
        if target:
            evaluation.check_writable(Path(target))
    runtime = runtime_for(args)
    with case_progress(len(jobs), title=f"eval {name}", enabled=progress_wanted()) as advance:
        results = trio.run(
            partial(
                evaluation.run_jobs,
                runtime,
                jobs,
                concurrency=args.concurrency,
                rerun_failed=args.rerun_failed,
                on_result=advance,
            ),
            restrict_keyboard_interrupt_to_checkpoints=True,
        )
    document = evaluation.report(name, agent, results)
    if args.json_report:
        evaluation.write_json(Path(args.json_report), document)
    if args.html_report:
        evaluation.write_text(Path(args.html_report), eval_html(document))
    evaluation.print_table(evaluation.eval_table(document))
    return evaluation.exit_code(results)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``loop-actors`` console script."""
    args = _build_parser().parse_args(argv)
    try:
        try:
            return _dispatch(args)
        except BaseExceptionGroup as group:
            raise single_exception(group) from None
    except LeaseHeldError as error:
        print(f"loop-actors: error: {terminal_safe(error)}", file=sys.stderr)
        return EXIT_LEASE_HELD
    except UsageError as error:
        print(f"loop-actors: error: {terminal_safe(error)}", file=sys.stderr)
        return EXIT_USAGE
    except InconsistentHistoryError as error:
        print(f"loop-actors: error: {terminal_safe(error)}", file=sys.stderr)
        return EXIT_TAMPERED
    except BrokenPipeError:  # the reader (e.g. `head`) went away: not an error of ours
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("loop-actors: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # the last line of defence: one line, exit 1
        print(
            f"loop-actors: internal error: {terminal_safe(describe_error(error))}",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
