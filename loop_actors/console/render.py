"""The console's HTML: its Jinja templates (package data), rendered with every value escaped.

Used by the pages and by ``loop-actors export --html`` (which needs no web server):
this module imports Jinja, not Starlette. ``autoescape`` is on and an undefined name is
an error: a goal, an argument or a tool output holding ``<script>`` is shown as text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from typing import Any

import jinja2

from projections import MetricsRow

PACKAGE = files("loop_actors.console")


def _pretty(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _age(stamp: object) -> str:
    """How long ago an ISO time was, in words (``3 min``)."""
    if not isinstance(stamp, str):
        return ""
    try:
        then = datetime.fromisoformat(stamp)
    except ValueError:
        return ""
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = max(0, int((datetime.now(UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


BAR_WIDTH = 480
"""The longest bar of a chart, in pixels (an SVG attribute: the CSP allows no inline style)."""

CHARTS: tuple[tuple[str, Callable[[MetricsRow], float | None], str], ...] = (
    ("invocations", lambda row: row.invocations, ""),
    ("wall time, median", lambda row: row.wall_ms_p50, " ms"),
    ("wall time, 95th percentile", lambda row: row.wall_ms_p95, " ms"),
    ("cost", lambda row: row.cost, ""),
    ("tool calls", lambda row: row.tool_calls, ""),
)
"""The metrics page's charts: a title, the figure of a group, its unit."""


@dataclass(frozen=True)
class Bar:
    """One bar of a chart: its group, its value as shown, its length in pixels."""

    group: str
    shown: str
    width: int


@dataclass(frozen=True)
class Chart:
    """A horizontal bar chart, drawn as SVG by the template."""

    title: str
    bars: list[Bar]


def bar_chart(title: str, values: list[tuple[str, float | None]], unit: str) -> Chart:
    """Bars scaled to the largest value (a group with none, or 0, gets no bar)."""
    largest = max((v for _, v in values if v is not None), default=0) or 1
    bars = [
        Bar(
            group,
            "" if value is None else f"{value:.4g}{unit}",
            0 if not value else max(1, round(BAR_WIDTH * value / largest)),
        )
        for group, value in values
    ]
    return Chart(title, bars)


@cache
def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(PACKAGE / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["pretty"] = _pretty
    environment.filters["age"] = _age
    return environment


def render_html(name: str, **context: Any) -> str:
    """A template rendered (every value escaped)."""
    return _environment().get_template(name).render(**context)


def inline_css() -> str:
    """The console's style sheet, for a page that carries it inline (an export)."""
    return (PACKAGE / "static" / "console.css").read_text()
