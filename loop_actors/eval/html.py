"""``loop-actors eval --html`` and ``eval compare --html``: one self-contained HTML file.

The page needs no network: its style, its charts (SVG) and its few lines of script
are inline, and its Content-Security-Policy forbids loading anything else. It is
built from the typed report (:class:`~loop_actors.eval.report.EvalReport`), so what it
shows is what the JSON report says.

The markup is in Jinja templates (``loop_actors/eval/templates/``, package data); this
module lays the charts out and hands the templates the report. The environment escapes
every value it writes (``autoescape``; an undefined name is an error, not a blank): a goal
``<script>...`` from a run is shown, never run. A case's trajectory is read defensively
(a hand-edited report still renders): a list that is not one is shown as empty, a number
that is not one as 0.

Jinja is imported when a page is rendered, not with this module: ``loop-actors --version``
and the commands that write no HTML do not load it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, ClassVar

from loop_actors.eval.report import ComparedCase, Comparison, EvalReport, ReportCase
from projections.evaluation import CaseStatus, Distribution, Group

if TYPE_CHECKING:
    import jinja2

_COLOURS = {"passed": "#2e7d32", "failed": "#c62828", "error": "#6a1b9a"}
_FLIP_COLOURS = {"broke": "#c62828", "fixed": "#2e7d32", "same": "#90a4ae"}
_BADGES = ("passed", "failed", "error", "broke", "fixed", "ok", "granted", "denied", "committed")
"""Words with a badge colour of their own (``.b-passed``...); any other is ``b-other``."""


def _shown(value: object) -> object:
    """What ``{{ value }}`` writes before it is escaped: None as nothing."""
    return "" if value is None else value


_ENTITIES = (("&#34;", "&quot;"), ("&#39;", "&#x27;"))
"""Jinja's escaper writes ``"`` and ``'`` as ``&#34;`` and ``&#39;``; the page has always
written them as :func:`html.escape` does. Every ``&`` of a value is escaped to ``&amp;``,
so these entities in a page come from the escaper alone."""


def _num(value: object) -> float:
    """A number of a report, or 0 for anything else (a hand-edited report cannot break the page)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(value)


def _dicts(value: object) -> list[Mapping[str, object]]:
    """The objects of a list of a report (anything else: none)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def _json(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@cache
def _environment() -> jinja2.Environment:
    """The templates' environment: autoescaped, strict about undefined names."""
    # Imported here, not at the top: only a command that writes a page pays for it.
    import jinja2  # noqa: PLC0415

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("loop_actors.eval", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        finalize=_shown,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters.update(number=_number, clip=_clip, fmt=format)
    environment.globals.update(badges=_BADGES)
    return environment


def _render(template: str, **context: object) -> str:
    page = _environment().get_template(template).render(**context)
    for written, spelt in _ENTITIES:
        page = page.replace(written, spelt)
    return page


# --------------------------------------------------------------------------- charts


@dataclass(frozen=True)
class _Segment:
    x: str
    width: str
    colour: str
    part: str
    count: int


@dataclass(frozen=True)
class _BarRow:
    y: int
    label: str
    segments: list[_Segment]
    end: str
    """Where the row's total is written."""
    total: int


@dataclass(frozen=True)
class _StackedBars:
    """Horizontal stacked bars, one row per label, one segment per part (passed, failed...)."""

    kind: ClassVar[str] = "bars"
    title: str
    width: int
    height: int
    label_width: int
    top: int
    rows: list[_BarRow]
    legend: list[tuple[int, str, str]]
    """(x, colour, part) of each legend entry."""


def _stacked_bars(
    title: str, rows: Sequence[tuple[str, Mapping[str, int]]], colours: Mapping[str, str]
) -> _StackedBars:
    label_width, bar_width, row_height, top = 150, 330, 24, 8
    most = max((sum(parts.values()) for _, parts in rows), default=0) or 1
    laid_out = []
    for index, (label, parts) in enumerate(rows):
        x = float(label_width)
        segments = []
        for part, count in parts.items():
            if not count:
                continue
            width = bar_width * count / most
            segments.append(
                _Segment(f"{x:.1f}", f"{width:.1f}", colours.get(part, "#78909c"), part, count)
            )
            x += width
        laid_out.append(
            _BarRow(top + index * row_height, label, segments, f"{x + 4:.1f}", sum(parts.values()))
        )
    return _StackedBars(
        title=title,
        width=label_width + bar_width + 40,
        height=top + row_height * max(len(rows), 1) + 22,
        label_width=label_width,
        top=top,
        rows=laid_out,
        legend=[
            (label_width + i * 90, colour, part) for i, (part, colour) in enumerate(colours.items())
        ],
    )


@dataclass(frozen=True)
class _Bar:
    x: str
    y: str
    width: str
    height: str
    count: int
    start: str
    end: str


@dataclass(frozen=True)
class _Marker:
    x: str
    text_x: str
    y: int
    anchor: str
    label: str
    value: str


@dataclass(frozen=True)
class _Histogram:
    """A histogram of a measure's values with labelled vertical markers (p50, p95, a mean...)."""

    kind: ClassVar[str] = "histogram"
    title: str
    unit: str
    left: int
    width: int
    top: int
    plot_height: int
    height: int
    count: int
    """How many values (0: "no scored runs")."""
    bars: list[_Bar]
    markers: list[_Marker]
    band: tuple[str, str, str, str] | None
    """(x, width, low, high) of the shaded interval."""
    low: str
    high: str
    tallest: int


def _histogram(
    title: str,
    values: Sequence[float],
    unit: str,
    markers: Sequence[tuple[str, float]] = (),
    band: tuple[float, float] | None = None,
    *,
    from_zero: bool = True,
) -> _Histogram:
    """Lay a histogram out: a measure that cannot be negative starts at 0 (``from_zero``)."""
    left, width, top, plot_height = 40, 400, 18, 120
    chart = _Histogram(
        title=title,
        unit=unit,
        left=left,
        width=width,
        top=top,
        plot_height=plot_height,
        height=top + plot_height + 36,
        count=len(values),
        bars=[],
        markers=[],
        band=None,
        low="",
        high="",
        tallest=0,
    )
    if not values:
        return chart
    low = float(min([*values, *(m for _, m in markers), *(band or ())]))
    high = float(max([*values, *(m for _, m in markers), *(band or ())]))
    if from_zero:
        low = min(low, 0.0)
    if math.isclose(low, high):
        low, high = (low, low + 1) if from_zero else (low - 0.5, high + 0.5)
    bins = max(2, min(12, len(values)))
    counts = [0] * bins
    for value in values:
        counts[min(bins - 1, int((value - low) / (high - low) * bins))] += 1
    tallest = max(counts)

    def x_of(value: float) -> float:
        return left + (value - low) / (high - low) * width

    shaded = None
    if band is not None:
        shaded = (
            f"{x_of(band[0]):.1f}",
            f"{max(1.0, x_of(band[1]) - x_of(band[0])):.1f}",
            _number(band[0]),
            _number(band[1]),
        )
    bin_width = width / bins
    bars = [
        _Bar(
            x=f"{left + index * bin_width + 1:.1f}",
            y=f"{top + plot_height - plot_height * count / tallest:.1f}",
            width=f"{bin_width - 2:.1f}",
            height=f"{plot_height * count / tallest:.1f}",
            count=count,
            start=_number(low + (high - low) * index / bins),
            end=_number(low + (high - low) * (index + 1) / bins),
        )
        for index, count in enumerate(counts)
        if count
    ]
    placed = []
    for index, (label, value) in enumerate(markers):
        x = x_of(value)
        # A marker on the right half is labelled on its left: the label stays inside.
        anchor, text_x = ("end", x - 3) if x > left + width / 2 else ("start", x + 3)
        placed.append(
            _Marker(
                f"{x:.1f}", f"{text_x:.1f}", top + 8 + index * 12, anchor, label, _number(value)
            )
        )
    return replace(
        chart,
        bars=bars,
        markers=placed,
        band=shaded,
        low=_number(low),
        high=_number(high),
        tallest=tallest,
    )


def _group_rows(groups: Mapping[str, Group]) -> list[tuple[str, dict[str, int]]]:
    return [
        (name, {"passed": g.passed, "failed": g.failed, "error": g.errored})
        for name, g in groups.items()
    ]


def _markers(distribution: Distribution | None) -> list[tuple[str, float]]:
    if distribution is None:
        return []
    return [("p50", distribution.p50), ("p95", distribution.p95)]


def _status_counts(cases: Iterable[ReportCase]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "error": 0}
    for case in cases:
        counts[case.status.value] += 1
    return counts


# --------------------------------------------------------------------------- one case


@dataclass(frozen=True)
class _CallView:
    """A call of a step as the page shows it (its values as the trajectory holds them)."""

    name: object
    call_id: object
    status: object
    arguments: str
    output: str | None
    """The result as JSON, for a call that returned (``ok``)."""
    error: object
    duration: str | None
    effect: object
    effect_key: object
    effect_status: object


@dataclass(frozen=True)
class _StepView:
    step: object
    kind: object
    summary: str
    usage: str
    rejection: str | None
    calls: list[_CallView]


@dataclass(frozen=True)
class _TrajectoryView:
    goal: object
    steps: list[_StepView]
    status: object
    reason: object
    detail: object


@dataclass(frozen=True)
class _CaseView:
    """A report's entry and what the page derives from it."""

    case: ReportCase
    trajectory: _TrajectoryView | None
    """None: no trajectory recorded (or none that is an object)."""
    first_failure: str
    used: str


def _call_view(call: Mapping[str, object]) -> _CallView:
    duration = call.get("duration_ms")
    return _CallView(
        name=call.get("name"),
        call_id=call.get("call_id"),
        status=call.get("status"),
        arguments=_json(call.get("arguments")),
        output=_json(call.get("output")) if call.get("status") == "ok" else None,
        error=call.get("error_message") or None,
        duration=None if duration is None else _number(_num(duration)),
        effect=call.get("effect", "read"),
        effect_key=call.get("effect_key") or None,
        effect_status=call.get("effect_status") or "unknown",
    )


def _step_view(step: Mapping[str, object]) -> _StepView:
    tokens = _num(step.get("input_tokens")) + _num(step.get("output_tokens"))
    usage = (
        f"{_number(tokens)} tokens · cost {_number(_num(step.get('cost')))} · "
        f"{_number(_num(step.get('latency_ms')))} ms"
    )
    rejection = step.get("rejection")
    return _StepView(
        step=step.get("step"),
        kind=step.get("kind"),
        summary=_clip(str(step.get("summary", "")), 2000),
        usage=usage,
        rejection=_json(rejection) if rejection else None,
        calls=[_call_view(call) for call in _dicts(step.get("calls"))],
    )


def _trajectory_view(trajectory: Mapping[str, object] | None) -> _TrajectoryView | None:
    """The trajectory read defensively: a hand-edited one still renders."""
    if not trajectory:
        return None
    return _TrajectoryView(
        goal=trajectory.get("goal"),
        steps=[_step_view(step) for step in _dicts(trajectory.get("steps"))],
        status=trajectory.get("status"),
        reason=trajectory.get("reason"),
        detail=trajectory.get("detail") or None,
    )


def _first_failure(case: ReportCase) -> str:
    if case.error:
        return case.error
    if not case.failures:
        return ""
    first = case.failures[0]
    more = f" (+{len(case.failures) - 1})" if len(case.failures) > 1 else ""
    return f"{first.expectation}: {first.why}{more}"


def _case_view(case: ReportCase) -> _CaseView:
    return _CaseView(
        case=case,
        trajectory=_trajectory_view(case.trajectory),
        first_failure=_first_failure(case),
        used=(
            f"{case.steps} steps, {case.tool_calls} tool calls, {case.tokens} tokens, "
            f"cost {_number(_num(case.cost))}, {_number(_num(case.latency_ms))} ms"
        ),
    )


# --------------------------------------------------------------------------- the pages


def eval_html(report: EvalReport) -> str:
    """The report (``loop-actors-eval/1``) as one self-contained HTML page."""
    scored = [c for c in report.cases if c.status is not CaseStatus.ERROR]
    totals = report.totals
    charts = [
        _stacked_bars("cases by terminal reason", _group_rows(report.by_reason), _COLOURS),
        _stacked_bars("cases by task class", _group_rows(report.by_task_class), _COLOURS),
        _histogram("latency", [c.latency_ms for c in scored], "ms", _markers(totals.latency_ms)),
        _histogram("cost", [c.cost for c in scored], "cost", _markers(totals.cost)),
        _histogram("tokens", [c.tokens for c in scored], "tokens", _markers(totals.tokens)),
        _histogram("steps", [c.steps for c in scored], "steps", _markers(totals.steps)),
    ]
    return _render(
        "eval.html.j2",
        report=report,
        charts=charts,
        cases=[_case_view(case) for case in report.cases],
    )


def compare_html(
    comparison: Comparison,
    a: EvalReport,
    b: EvalReport,
    names: tuple[str, str] = ("A", "B"),
) -> str:
    """A comparison (``loop-actors-eval-compare/1``) and both reports' cases, side by side."""
    by_key_a = {(c.case_id, c.epoch): c for c in a.cases}
    by_key_b = {(c.case_id, c.epoch): c for c in b.cases}
    rows: list[ComparedCase] = comparison.cases
    flips = {
        "broke": comparison.broke,
        "fixed": comparison.fixed,
        "same": len(rows) - comparison.broke - comparison.fixed,
    }
    charts: list[_StackedBars | _Histogram] = [
        _stacked_bars("flips", [("paired cases", flips)], _FLIP_COLOURS),
        _stacked_bars(
            "results",
            [(names[0], _status_counts(a.cases)), (names[1], _status_counts(b.cases))],
            _COLOURS,
        ),
    ]
    for measure, unit in (("latency_ms", "ms"), ("cost", "cost")):
        interval = comparison.bootstrap.get(measure)
        charts.append(
            _histogram(
                f"Δ{measure} per paired case (B - A)",
                [getattr(row, measure) for row in rows if CaseStatus.ERROR not in row.status],
                unit,
                [("mean", interval.mean_delta)] if interval else [],
                (interval.low, interval.high) if interval else None,
                from_zero=False,
            )
        )
    views_a = {key: _case_view(case) for key, case in by_key_a.items()}
    views_b = {key: _case_view(case) for key, case in by_key_b.items()}
    sides = [
        (views_a.get((row.case_id, row.epoch)), views_b.get((row.case_id, row.epoch)))
        for row in rows
    ]
    return _render(
        "compare.html.j2",
        comparison=comparison,
        a=a,
        b=b,
        names=names,
        charts=charts,
        pairs=list(zip(rows, sides, strict=True)),
    )
