"""Rich renderings of the read models for the terminal."""

from __future__ import annotations

import json
import re
from typing import Any

from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from projections import MetricsRow, Trajectory

STATUS_STYLE = {
    "ok": "green",
    "completed": "bold green",
    "committed": "green",
    "reconciled": "green",
    "dispatched": "yellow",
    "outcome_unknown": "bold yellow",
    "running": "yellow",
}
PAUSES = {"approval_required", "clarification_required", "reconciliation_required"}


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: object) -> str:
    r"""Text from a model, a tool or a service as it may reach an operator's terminal.

    C0 and C1 control characters (but newline and tab) and DEL are shown as escapes
    (``\x1b``), so an answer holding ``\x1b[31m`` cannot drive the terminal; so are
    lone surrogates (which a terminal cannot be sent at all).
    """
    value = text if isinstance(text, str) else str(text)
    return _CONTROL.sub(_escape, value)


def _text(value: object, style: str = "") -> Text:
    """A table cell or tree label from outside text: escaped, never read as markup."""
    return Text(terminal_safe(value), style=style)


def _style(status: str | None) -> str:
    if status is None:
        return "dim"
    if status in STATUS_STYLE:
        return STATUS_STYLE[status]
    return "yellow" if status in PAUSES else "red"


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_tree(trajectory: Trajectory) -> Tree:
    """An invocation as a tree: steps, then each call with its status.

    ``loop-actors demo`` and ``loop-actors show`` both print it.
    """
    reason = trajectory.reason.value if trajectory.reason else trajectory.status.value
    title = Text.assemble(
        (terminal_safe(trajectory.invocation_id), "bold"),
        f"  agent {terminal_safe(trajectory.agent_name)}  ",
        (reason, _style(reason)),
        f"  steps={len(trajectory.steps)} tool_calls={trajectory.tool_calls}",
    )
    tree = Tree(title)
    tree.add(_text(f"goal: {trajectory.goal}", style="dim"))
    for step in trajectory.steps:
        usage = f"  tokens={step.input_tokens}/{step.output_tokens}" if step.input_tokens else ""
        branch = tree.add(_text(f"step {step.step}: {step.kind} — {step.summary}{usage}"))
        for call in step.calls:
            label = Text.assemble(
                terminal_safe(f"{call.call_id} {call.name}({_short(call.arguments, 40)}) → "),
                (call.status, _style(call.status)),
            )
            if call.effect_status:
                label.append(f" [effect {call.effect_status}]", style=_style(call.effect_status))
            if call.duration_ms is not None:
                label.append(f" {call.duration_ms:.1f} ms", style="dim")
            shown = _short(call.output) if call.status == "ok" else (call.error_message or "")
            if shown:
                label.append(terminal_safe(f": {shown}"))
            branch.add(label)
    if trajectory.answer:
        tree.add(_text(f"answer: {trajectory.answer}", style="bold"))
    if trajectory.detail:
        tree.add(_text(f"detail: {trajectory.detail}", style=_style(reason)))
    return tree


def invocations_table(rows: list[dict[str, Any]]) -> Table:
    """Invocations, one a row."""
    table = Table("id", "agent", "reason", "steps", "tool calls", "started", "goal")
    for row in rows:
        reason = row["reason"] or row["status"]
        table.add_row(
            _text(row["invocation_id"]),
            _text(row["agent"]),
            Text(reason, style=_style(reason)),
            str(row["steps"]),
            str(row["tool_calls"]),
            (row["started_at"] or "")[:19],
            _text(_short(row["goal"], 40).strip('"')),
        )
    return table


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def metrics_table(rows: list[MetricsRow], by: str) -> Table:
    """Metrics, one group a row."""
    table = Table(
        by, "n", "running", "steps", "tool calls", "tokens in/out", "cost",
        "wall p50 ms", "p95", "max", "repeated plans", "failed calls", "effects",
    )  # fmt: skip
    for row in rows:
        table.add_row(
            _text(row.group, style=_style(row.group) if by == "reason" else ""),
            str(row.invocations),
            str(row.running),
            f"{row.steps_mean:.1f}",
            str(row.tool_calls),
            f"{row.input_tokens}/{row.output_tokens}",
            f"{row.cost:.4f}",
            _ms(row.wall_ms_p50),
            _ms(row.wall_ms_p95),
            _ms(row.wall_ms_max),
            str(row.repeated_plans),
            ", ".join(f"{k}={v}" for k, v in sorted(row.failed_calls.items())) or "-",
            ", ".join(f"{k}={v}" for k, v in sorted(row.effects.items())) or "-",
        )
    return table


def effects_table(rows: list[dict[str, Any]]) -> Table:
    """Open effects, oldest first."""
    table = Table(
        "effect key", "invocation", "step", "call", "tool", "status", "attempt", "since", "needs"
    )
    for row in rows:
        table.add_row(
            _text(row["effect_key"]),
            _text(row["invocation_id"]),
            str(row["step"]),
            _text(row["call_id"]),
            _text(row["tool"]),
            Text(row["status"], style=_style(row["status"])),
            str(row["attempt"]),
            (row["prepared_at"] or "")[:19],
            row["needs"],
        )
    return table
