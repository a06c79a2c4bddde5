"""The options of the commands that run and steer invocations (``run``, ``resume``...)."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, checkpoint_options, db_option


def _add_run(run: argparse.ArgumentParser) -> None:
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


def _add_resume(resume: argparse.ArgumentParser) -> None:
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


def _add_approve(approve: argparse.ArgumentParser) -> None:
    approve.add_argument("invocation_id", metavar="ID")
    approve.add_argument("--digest", required=True, help="the digest the paused run printed")
    approve.add_argument("--by", required=True, metavar="NAME", help="who approves (audited)")
    approve.add_argument("--note", help="why (audited)")
    approve.add_argument("--agent", metavar="MODULE:ATTR", help="resume right away with it")
    approve.add_argument("--json", action="store_true")


def _add_deny(deny: argparse.ArgumentParser) -> None:
    deny.add_argument("invocation_id", metavar="ID")
    deny.add_argument("--by", required=True, metavar="NAME", help="who denies (audited)")
    deny.add_argument("--reason", required=True, help="why (audited, and told to the model)")
    deny.add_argument("--agent", metavar="MODULE:ATTR", help="resume right away with it")
    deny.add_argument("--json", action="store_true")


def _add_clarify(clarify: argparse.ArgumentParser) -> None:
    clarify.add_argument("invocation_id", metavar="ID")
    clarify.add_argument("--answer", required=True, help="the answer the model will see")
    clarify.add_argument("--by", metavar="NAME", help="who answers (audited)")
    clarify.add_argument("--agent", metavar="MODULE:ATTR", help="resume right away with it")
    clarify.add_argument("--json", action="store_true")


def _add_cancel(cancel: argparse.ArgumentParser) -> None:
    cancel.add_argument("invocation_id", metavar="ID")
    cancel.add_argument("--by", metavar="NAME", help="who asks (audited)")
    cancel.add_argument("--reason", help="why (audited)")
    cancel.add_argument("--json", action="store_true")


def _add_wake(wake: argparse.ArgumentParser) -> None:
    wake.add_argument("invocation_id", metavar="ID")
    wake.add_argument("--by", metavar="NAME", help="who wakes it (audited)")
    wake.add_argument("--agent", metavar="MODULE:ATTR", help="resume right away with it")
    wake.add_argument("--json", action="store_true")


def _add_reconcile(reconcile: argparse.ArgumentParser) -> None:
    reconcile.add_argument("--agent", required=True, metavar="MODULE:ATTR")
    reconcile.add_argument("--json", action="store_true", help="print a JSON report")


def _runs(add_options: AddArguments) -> AddArguments:
    """A command's options, then ``--db`` and the checkpoint options (every command here)."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_options(parser)
        db_option(parser)
        checkpoint_options(parser)

    return add_arguments


ARGUMENTS: dict[str, AddArguments] = {
    "run": _runs(_add_run),
    "resume": _runs(_add_resume),
    "approve": _runs(_add_approve),
    "deny": _runs(_add_deny),
    "clarify": _runs(_add_clarify),
    "cancel": _runs(_add_cancel),
    "wake": _runs(_add_wake),
    "reconcile": _runs(_add_reconcile),
}
