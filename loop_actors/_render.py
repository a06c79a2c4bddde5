"""Rich renderings of the read models for the terminal, and tables fitted to its width.

A table's columns are of three kinds (:class:`Fit`): numbers and other values that are
never cut nor wrapped, ids that are never cut (folded onto a second line only when
nothing else can give), and text that wraps first. On a terminal narrower than a
table, :func:`print_table` makes it compact and narrows its text, then its ids; on a
pipe or in a file every column has its natural width, so nothing wraps.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from aggregates.decisions import Plan
from loop_actors._terminal import terminal_safe
from projections import CritiqueView, MetricsRow, Trajectory, plans_against_done

STATUS_STYLE = {
    "ok": "green",
    "completed": "bold green",
    "committed": "green",
    "reconciled": "green",
    "dispatched": "yellow",
    "outcome_unknown": "bold yellow",
    "running": "yellow",
    "accept": "green",
    "revise": "yellow",
}
PAUSES = {
    "approval_required",
    "clarification_required",
    "reconciliation_required",
    "plan_approval_required",
}


def console() -> Console:
    """The console the tables and trees are printed to."""
    # A pipe or a file gets wide lines rather than columns cut to 80 characters.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


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
    text = _json(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


CALL_INDENT = 8
"""The columns a call's line of the tree starts at (two levels of guides)."""

ARGUMENTS_AT_LEAST = 40
OUTPUT_AT_LEAST = 60
"""What a call's arguments and output are cut to at most, however narrow the line."""


def _limits(arguments: str, output: str, room: int) -> tuple[int, int]:
    """How long a call's arguments and output may be shown, in ``room`` columns for both.

    Both whole when they fit; else each gets the room the other leaves, and never less
    than its floor (``ARGUMENTS_AT_LEAST``, ``OUTPUT_AT_LEAST``).
    """
    if len(arguments) + len(output) <= room:
        return len(arguments), len(output)
    for_arguments = max(ARGUMENTS_AT_LEAST, room - min(len(output), OUTPUT_AT_LEAST))
    shown = min(len(arguments), for_arguments)
    return for_arguments, max(OUTPUT_AT_LEAST, room - shown)


def render_tree(trajectory: Trajectory, *, width: int = 200) -> Tree:
    """An invocation as a tree: steps, then each call with its status.

    ``loop-actors demo`` and ``loop-actors show`` both print it. A call's arguments and
    output are cut (``…``) only where its line would pass ``width`` (the terminal's).
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
        decided = f" ({step.approval})" if step.approval else ""
        branch = tree.add(_text(f"step {step.step}: {step.kind} — {step.summary}{decided}{usage}"))
        if isinstance(step.decision, Plan):
            for index, planned in enumerate(step.decision.steps, start=1):
                why = f" — {planned.description}" if planned.description else ""
                branch.add(_text(f"{index}. {planned.tool}({_json(planned.arguments)}){why}"))
        for call in step.calls:
            effect = f" [effect {call.effect_status}]" if call.effect_status else ""
            duration = f" {call.duration_ms:.1f} ms" if call.duration_ms is not None else ""
            arguments = _json(call.arguments)
            output = _json(call.output) if call.status == "ok" else (call.error_message or "")
            fixed = len(f"{call.call_id} {call.name}() → {call.status}{effect}{duration}: ")
            for_arguments, for_output = _limits(arguments, output, width - CALL_INDENT - fixed)
            label = Text.assemble(
                terminal_safe(
                    f"{call.call_id} {call.name}({_short(call.arguments, for_arguments)}) → "
                ),
                (call.status, _style(call.status)),
            )
            if effect:
                label.append(effect, style=_style(call.effect_status))
            if duration:
                label.append(duration, style="dim")
            if call.plan_step is not None:
                label.append(f" [plan step {call.plan_step}]", style="dim")
            shown = _short(call.output, for_output) if call.status == "ok" else output
            if shown:
                label.append(terminal_safe(f": {shown}"))
            branch.add(label)
        for critique in trajectory.critiques:
            if critique.step == step.step:
                branch.add(_critique_label(critique))
    if trajectory.critiques:
        tree.add(
            _text(
                f"critic: {len(trajectory.critiques)} round(s)  tokens="
                f"{trajectory.critic_input_tokens}/{trajectory.critic_output_tokens}"
                f"  cost={trajectory.critic_cost:.4f} (apart from the agent's)",
                style="dim",
            )
        )
    for plan in plans_against_done(trajectory):
        made = sum(1 for w in plan.writes if w.made_at is not None)
        tree.add(
            _text(
                f"plan of step {plan.step}: {made} of {len(plan.writes)} write(s) made, "
                f"{len(plan.outside)} outside it",
                style="dim",
            )
        )
    if trajectory.answer:
        tree.add(_text(f"answer: {trajectory.answer}", style="bold"))
    if trajectory.detail:
        tree.add(_text(f"detail: {trajectory.detail}", style=_style(reason)))
    return tree


def _critique_label(critique: CritiqueView) -> Text:
    """A critic's round under the step it reviewed: ``critic round 1: revise — why``."""
    said = critique.critique or critique.problem
    usage = (
        f"  tokens={critique.input_tokens}/{critique.output_tokens}"
        if critique.input_tokens
        else ""
    )
    label = Text(f"critic round {critique.round}: ")
    label.append(critique.verdict, style=_style(critique.verdict))
    if said:
        label.append(terminal_safe(f" — {said}"))
    if usage:
        label.append(usage, style="dim")
    return label


# --------------------------------------------------------------------------- fitted tables


@dataclass(frozen=True)
class Fit:
    """How a column gives way when its table is wider than the terminal."""

    kind: Literal["whole", "id", "text"]
    """``whole``: a number or a value that is never cut nor wrapped (its header may wrap);
    ``id``: never cut, folded onto more lines only once the text columns are at their
    narrowest; ``text``: wraps (or folds) first."""
    least: int | None = None
    """The narrowest an ``id`` or ``text`` column gets (default: 12 for an id, 9 for text,
    and never below its header's longest word)."""


WHOLE = Fit("whole")
ID = Fit("id")
TEXT = Fit("text")
TIME = Fit("text", 10)
"""A ``2026-12-01T10:00:00`` column: folded at the ``T`` when it must give way."""

_AT_LEAST = {"id": 12, "text": 9}


def _measuring_console() -> Console:
    return Console(width=100_000, file=io.StringIO(), highlight=False)


def _widths(console: Console, renderables: Sequence[RenderableType]) -> tuple[int, int]:
    """The widest line, and the longest word, of these cells."""
    measured = [Measurement.get(console, console.options, cell) for cell in renderables]
    return max(m.maximum for m in measured), max(m.minimum for m in measured)


def _narrow(widths: list[int], floors: list[int], columns: list[int], excess: int) -> int:
    """Take up to ``excess`` columns of width from these columns, the widest first."""
    while excess > 0:
        room = [i for i in columns if widths[i] > floors[i]]
        if not room:
            break
        widest = max(room, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return excess


def fit_table(table: Table, fits: Sequence[Fit], width: int | None) -> int:
    """Fit ``table``'s columns into ``width`` columns; return the width it needs.

    ``None`` (a pipe, a file) and a table that fits leave the table as it is. Else it
    is made compact (no frame, two spaces between columns, then one) and its columns
    are narrowed: the headers of ``whole`` columns wrap first, then ``text`` columns
    wrap, and only at one space ``id`` columns fold; a ``whole`` column keeps its
    widest value. When even that is too wide, the table is left wider than ``width``
    (the width returned), never cut.
    """
    assert len(fits) == len(table.columns)
    measuring = _measuring_console()
    natural = Measurement.get(measuring, measuring.options, table).maximum
    if width is None or natural <= width:
        return natural
    table.box, table.show_edge, table.pad_edge = box.SIMPLE_HEAD, False, False
    naturals, floors = [], []
    for column, fit in zip(table.columns, fits, strict=True):
        header = column.header if isinstance(column.header, Text) else Text(str(column.header))
        cells = list(column.cells)
        widest, _ = _widths(measuring, cells) if cells else (0, 0)
        header_widest, header_word = _widths(measuring, [header])
        naturals.append(max(widest, header_widest, column.min_width or 0))
        if fit.kind == "whole":
            floors.append(max(widest, header_word))
        else:
            floors.append(min(naturals[-1], max(fit.least or _AT_LEAST[fit.kind], header_word)))
        column.header = Text(header.plain, no_wrap=False, overflow="fold")
        column.min_width = None
        column.width = naturals[-1]
    for padding, kinds in (((0, 1), ("whole", "text")), ((0, 0), ("whole", "text", "id"))):
        table.padding, table.collapse_padding = padding, True
        widths = list(naturals)
        overhead = Measurement.get(measuring, measuring.options, table).maximum - sum(widths)
        excess = sum(widths) + overhead - width
        for kind in kinds:
            chosen = [i for i, fit in enumerate(fits) if fit.kind == kind]
            excess = _narrow(widths, floors, chosen, excess)
        if excess <= 0:
            break
    for column, fit, size in zip(table.columns, fits, widths, strict=True):
        column.width = size
        column.no_wrap = fit.kind == "whole"
        column.overflow = "ignore" if fit.kind == "whole" else "fold"
    return sum(widths) + overhead


def print_table(
    console: Console, renderable: RenderableType, table: Table, fits: Sequence[Fit]
) -> None:
    """Print ``renderable`` (``table``, or a group holding it) with the table fitted.

    On a terminal the table is fitted to its width; elsewhere (a pipe, a file) its
    columns keep their natural widths. It is printed wider than the console rather
    than cut; lines carry no trailing blanks.
    """
    needed = fit_table(table, fits, console.width if console.is_terminal else None)
    out = io.StringIO()
    wide = Console(
        width=max(console.width, needed),
        file=out,
        highlight=False,
        force_terminal=console.is_terminal,
        color_system=console.color_system,  # type: ignore[arg-type]
        no_color=console.no_color,
    )
    wide.print(renderable)
    lines = out.getvalue().splitlines()
    console.file.write("".join(line.rstrip() + "\n" for line in lines))
    console.file.flush()


INVOCATIONS_FITS = (ID, TEXT, TEXT, WHOLE, WHOLE, TIME, TEXT)
"""How :func:`invocations_table`'s columns give way (see :func:`print_table`)."""


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


METRICS_FITS = (TEXT, *(WHOLE for _ in range(10)), TEXT, TEXT)
"""How :func:`metrics_table`'s columns give way."""


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


EFFECTS_FITS = (ID, ID, WHOLE, ID, TEXT, TEXT, WHOLE, TIME, TEXT)
"""How :func:`effects_table`'s columns give way."""


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
