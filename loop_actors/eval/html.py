"""``loop-actors eval --html`` and ``eval compare --html``: one self-contained HTML file.

The page needs no network: its style, its charts (SVG drawn here) and its few
lines of script are inline, and its Content-Security-Policy forbids loading
anything else. It is built from the JSON report (``loop-actors-eval/1``), so
what it shows is what the report says. Every value that comes from a run (a
goal, an answer, a tool's arguments or output, an error) is HTML-escaped where
it is written into the page: a goal ``<script>...`` is shown, never run.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_COLOURS = {"passed": "#2e7d32", "failed": "#c62828", "error": "#6a1b9a"}
_FLIP_COLOURS = {"broke": "#c62828", "fixed": "#2e7d32", "same": "#90a4ae"}


def _e(value: object) -> str:
    """``value`` as text, escaped for HTML content and attribute values."""
    return html.escape("" if value is None else str(value), quote=True)


def _json(value: object) -> str:
    return _e(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def _num(value: object) -> float:
    """A number of a report, or 0 for anything else (a hand-edited report cannot break the page)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(value)


def _dicts(value: object) -> list[Mapping[str, Any]]:
    """The objects of a list of a report (anything else: none)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


_STYLE = """
:root { --fg: #1c2430; --muted: #5b6675; --line: #d8dee6; --bg: #f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
       margin: 0; padding: 24px 32px; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 10px; }
h3 { font-size: 14px; margin: 14px 0 6px; }
.muted { color: var(--muted); }
.totals { display: flex; gap: 12px; flex-wrap: wrap; margin: 14px 0; }
.tile { border: 1px solid var(--line); border-radius: 8px; padding: 8px 14px; min-width: 110px; }
.tile b { display: block; font-size: 20px; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 16px; }
figure { margin: 0; border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; }
figcaption { font-weight: 600; margin-bottom: 6px; }
svg.chart { display: block; max-width: 100%; height: auto; margin: 0 auto; }
svg.chart text { font: 11px system-ui, sans-serif; fill: var(--fg); }
svg.chart .axis { stroke: var(--line); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line);
         vertical-align: top; }
th { background: var(--bg); font-weight: 600; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; padding: 0 8px; border-radius: 10px; color: #fff;
         font-size: 12px; font-weight: 600; }
.b-passed, .b-fixed, .b-ok, .b-granted, .b-committed { background: #2e7d32; }
.b-failed, .b-broke, .b-denied { background: #c62828; }
.b-error { background: #6a1b9a; }
.b-other { background: #78909c; }
details.case { border: 1px solid var(--line); border-radius: 8px; margin: 10px 0;
               padding: 6px 12px; }
details.case > summary { cursor: pointer; font-weight: 600; padding: 4px 0; }
.failures li { color: #b71c1c; }
.steps { list-style: none; padding: 0; margin: 0; }
.step { border-left: 3px solid var(--line); padding: 4px 0 8px 12px; margin: 6px 0; }
.step-head { font-weight: 600; }
.batch { display: flex; gap: 10px; flex-wrap: wrap; margin-top: 6px; }
.call { border: 1px solid var(--line); border-radius: 6px; padding: 6px 10px; background: var(--bg);
        flex: 1 1 260px; min-width: 220px; max-width: 520px; }
.call-head { font-weight: 600; }
pre { white-space: pre-wrap; word-break: break-word; margin: 4px 0; font-size: 12px;
      background: #fff; border: 1px solid var(--line); border-radius: 4px; padding: 4px 6px;
      max-height: 240px; overflow: auto; }
.sides { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
.side { min-width: 0; }
.filters button { margin-right: 6px; }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 6px 0; }
dl.kv dt { color: var(--muted); } dl.kv dd { margin: 0; white-space: pre-wrap;
                                               word-break: break-word; }
"""

_SCRIPT = """
(function () {
  function show(which) {
    document.querySelectorAll('[data-status]').forEach(function (el) {
      var keep = which === 'all' || el.getAttribute('data-status') === which;
      el.style.display = keep ? '' : 'none';
    });
  }
  document.querySelectorAll('button[data-show]').forEach(function (button) {
    button.addEventListener('click', function () { show(button.getAttribute('data-show')); });
  });
  document.querySelectorAll('button[data-open]').forEach(function (button) {
    button.addEventListener('click', function () {
      var open = button.getAttribute('data-open') === 'all';
      document.querySelectorAll('details.case').forEach(function (d) { d.open = open; });
    });
  });
})();
"""

_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'"
)


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}<script>{_SCRIPT}</script></body></html>\n"
    )


# --------------------------------------------------------------------------- charts


def _stacked_bars(
    title: str, rows: Sequence[tuple[str, Mapping[str, int]]], colours: Mapping[str, str]
) -> str:
    """Horizontal stacked bars, one row per label, one segment per part (passed, failed...)."""
    label_width, bar_width, row_height, top = 150, 330, 24, 8
    most = max((sum(parts.values()) for _, parts in rows), default=0) or 1
    height = top + row_height * max(len(rows), 1) + 22
    shapes: list[str] = []
    for index, (label, parts) in enumerate(rows):
        y = top + index * row_height
        shapes.append(
            f'<text x="{label_width - 6}" y="{y + 15}" text-anchor="end">'
            f"{_e(_clip(label, 24))}<title>{_e(label)}</title></text>"
        )
        x = float(label_width)
        for part, count in parts.items():
            if not count:
                continue
            width = bar_width * count / most
            shapes.append(
                f'<rect class="bar" x="{x:.1f}" y="{y + 3}" width="{width:.1f}" height="16" '
                f'fill="{colours.get(part, "#78909c")}"><title>{_e(label)}: {count} '
                f"{_e(part)}</title></rect>"
            )
            x += width
        total = sum(parts.values())
        shapes.append(f'<text x="{x + 4:.1f}" y="{y + 15}">{total}</text>')
    if not rows:
        shapes.append(f'<text x="{label_width}" y="{top + 15}">no cases</text>')
    legend_y = height - 6
    legend = "".join(
        f'<rect x="{label_width + i * 90}" y="{legend_y - 9}" width="10" height="10" '
        f'fill="{colour}"/><text x="{label_width + i * 90 + 14}" y="{legend_y}">{_e(part)}</text>'
        for i, (part, colour) in enumerate(colours.items())
    )
    return _figure(
        title,
        f'<svg class="chart" viewBox="0 0 {label_width + bar_width + 40} {height}" '
        f'width="{label_width + bar_width + 40}" height="{height}" role="img" '
        f'aria-label="{_e(title)}">{"".join(shapes)}{legend}</svg>',
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _histogram(
    title: str,
    values: Sequence[float],
    unit: str,
    markers: Sequence[tuple[str, float]] = (),
    band: tuple[float, float] | None = None,
    *,
    from_zero: bool = True,
) -> str:
    """A histogram of ``values`` with labelled vertical markers (p50, p95, a mean...).

    A measure that cannot be negative starts its axis at 0 (``from_zero``); a delta does not.
    """
    left, width, top, plot_height = 40, 400, 18, 120
    height = top + plot_height + 36
    shapes: list[str] = [
        f'<line class="axis" x1="{left}" y1="{top + plot_height}" x2="{left + width}" '
        f'y2="{top + plot_height}" stroke="#d8dee6"/>'
    ]
    if not values:
        shapes.append(f'<text x="{left}" y="{top + 40}">no scored runs</text>')
    else:
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

        if band is not None:
            shapes.append(
                f'<rect x="{x_of(band[0]):.1f}" y="{top}" '
                f'width="{max(1.0, x_of(band[1]) - x_of(band[0])):.1f}" height="{plot_height}" '
                f'fill="#ffe082" opacity="0.5"><title>95% interval {_number(band[0])} to '
                f"{_number(band[1])} {_e(unit)}</title></rect>"
            )
        bin_width = width / bins
        for index, count in enumerate(counts):
            if not count:
                continue
            bar_height = plot_height * count / tallest
            start = low + (high - low) * index / bins
            end = low + (high - low) * (index + 1) / bins
            shapes.append(
                f'<rect class="bar" x="{left + index * bin_width + 1:.1f}" '
                f'y="{top + plot_height - bar_height:.1f}" width="{bin_width - 2:.1f}" '
                f'height="{bar_height:.1f}" fill="#5c7cfa"><title>{count} run(s) in '
                f"{_number(start)} to {_number(end)} {_e(unit)}</title></rect>"
            )
        for index, (label, value) in enumerate(markers):
            x = x_of(value)
            # A marker on the right half is labelled on its left: the label stays inside.
            anchor, text_x = ("end", x - 3) if x > left + width / 2 else ("start", x + 3)
            shapes.append(
                f'<line class="marker" x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" '
                f'y2="{top + plot_height}" stroke="#ef6c00" stroke-dasharray="3,2"/>'
                f'<text x="{text_x:.1f}" y="{top + 8 + index * 12}" text-anchor="{anchor}">'
                f"{_e(label)} {_number(value)}</text>"
            )
        shapes.append(
            f'<text x="{left}" y="{top + plot_height + 14}">{_number(low)}</text>'
            f'<text x="{left + width}" y="{top + plot_height + 14}" text-anchor="end">'
            f"{_number(high)}</text>"
            f'<text x="{left + width / 2}" y="{top + plot_height + 30}" text-anchor="middle">'
            f"{_e(unit)} ({len(values)} run(s))</text>"
            f'<text x="{left - 6}" y="{top + 8}" text-anchor="end">{tallest}</text>'
        )
    return _figure(
        title,
        f'<svg class="chart" viewBox="0 0 {left + width + 20} {height}" '
        f'width="{left + width + 20}" height="{height}" role="img" aria-label="{_e(title)}">'
        f"{''.join(shapes)}</svg>",
    )


def _figure(title: str, svg: str) -> str:
    return f"<figure><figcaption>{_e(title)}</figcaption>{svg}</figure>"


def _group_rows(groups: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, dict[str, int]]]:
    return [
        (name, {"passed": g["passed"], "failed": g["failed"], "error": g["errored"]})
        for name, g in groups.items()
    ]


def _markers(distribution: Mapping[str, float] | None) -> list[tuple[str, float]]:
    if not distribution:
        return []
    return [("p50", distribution["p50"]), ("p95", distribution["p95"])]


# --------------------------------------------------------------------------- one case


def _badge(word: object, kind: str | None = None) -> str:
    text = "-" if word is None else str(word)
    known = {"passed", "failed", "error", "broke", "fixed", "ok", "granted", "denied", "committed"}
    css = kind or (text if text in known else "other")
    return f'<span class="badge b-{_e(css)}">{_e(text)}</span>'


def _call(call: Mapping[str, Any]) -> str:
    parts = [
        f'<div class="call"><div class="call-head">{_e(call.get("name"))} '
        f'<span class="muted">{_e(call.get("call_id"))}</span> {_badge(call.get("status"))}</div>',
        f"<pre>{_json(call.get('arguments'))}</pre>",
    ]
    if call.get("status") == "ok":
        parts.append(f'<div class="muted">result</div><pre>{_json(call.get("output"))}</pre>')
    if call.get("error_message"):
        parts.append(f'<div class="muted">error</div><pre>{_e(call["error_message"])}</pre>')
    facts = []
    if call.get("duration_ms") is not None:
        facts.append(f"{_number(_num(call['duration_ms']))} ms")
    facts.append(_e(call.get("effect", "read")))
    if call.get("effect_key"):
        facts.append(
            f"effect {_e(call['effect_key'])}: {_badge(call.get('effect_status') or 'unknown')}"
        )
    parts.append(f'<div class="muted">{" · ".join(facts)}</div></div>')
    return "".join(parts)


def _steps(trajectory: Mapping[str, Any] | None) -> str:
    if not trajectory:
        return '<p class="muted">no trajectory recorded</p>'
    items = []
    for step in _dicts(trajectory.get("steps")):
        calls = _dicts(step.get("calls"))
        tokens = _num(step.get("input_tokens")) + _num(step.get("output_tokens"))
        usage = (
            f"{_number(tokens)} tokens · cost {_number(_num(step.get('cost')))} · "
            f"{_number(_num(step.get('latency_ms')))} ms"
        )
        batch = ""
        if calls:
            label = (
                f'<div class="muted">one batch: {len(calls)} calls run in parallel</div>'
                if len(calls) > 1
                else ""
            )
            batch = f'{label}<div class="batch">{"".join(_call(call) for call in calls)}</div>'

        rejection = ""
        if step.get("rejection"):
            rejection = f"<pre>{_json(step['rejection'])}</pre>"
        items.append(
            f'<li class="step"><div class="step-head">step {_e(step.get("step"))} · '
            f"{_e(step.get('kind'))}</div>"
            f"<div>{_e(_clip(str(step.get('summary', '')), 2000))}</div>"
            f'<div class="muted">{usage}</div>{rejection}{batch}</li>'
        )
    end = trajectory.get("status"), trajectory.get("reason"), trajectory.get("detail")
    items.append(
        f'<li class="step"><div class="step-head">{_e(end[0])}: {_e(end[1] or "-")}</div>'
        + (f"<div>{_e(end[2])}</div>" if end[2] else "")
        + "</li>"
    )
    return f'<ol class="steps">{"".join(items)}</ol>'


def _failures(case: Mapping[str, Any]) -> str:
    lines = [
        f"<li><b>{_e(f.get('expectation'))}</b>: {_e(f.get('why'))}</li>"
        for f in _dicts(case.get("failures"))
    ]
    if case.get("error"):
        lines.append(f"<li><b>error</b>: {_e(case['error'])}</li>")
    if not lines:
        return ""
    return f'<h3>failed expectations</h3><ul class="failures">{"".join(lines)}</ul>'


def _approvals(case: Mapping[str, Any]) -> str:
    views = _dicts(case.get("approvals"))
    if not views:
        return ""
    rows = "".join(
        f"<li>step {_e(v.get('step'))}: {_e(v.get('tool'))} ({_e(v.get('call_id'))}) "
        f"{_badge(v.get('outcome'))}{' by ' + _e(v['by']) if v.get('by') else ''}</li>"
        for v in views
    )
    return f"<h3>paused for approval</h3><ul>{rows}</ul>"


def _case_body(case: Mapping[str, Any]) -> str:
    trajectory = case.get("trajectory")
    trajectory = trajectory if isinstance(trajectory, dict) else {}
    attempts = case.get("attempts")
    facts = [
        ("proves", case.get("proves")),  # a case that says what passing it proves
        ("attempts", attempts if isinstance(attempts, int) and attempts > 1 else None),
        ("goal", trajectory.get("goal")),
        ("answer", case.get("answer")),
        ("reason", case.get("reason")),
        ("invocation", case.get("invocation_id")),
        ("task class", case.get("task_class")),
        (
            "used",
            f"{case.get('steps', 0)} steps, {case.get('tool_calls', 0)} tool calls, "
            f"{case.get('tokens', 0)} tokens, cost {_number(_num(case.get('cost')))}, "
            f"{_number(_num(case.get('latency_ms')))} ms",
        ),
    ]
    kv = "".join(
        f"<dt>{_e(name)}</dt><dd>{_e(value)}</dd>" for name, value in facts if value is not None
    )
    return (
        f'<dl class="kv">{kv}</dl>{_failures(case)}{_approvals(case)}'
        f"<h3>trajectory</h3>{_steps(trajectory)}"
    )


def _case_name(case: Mapping[str, Any]) -> str:
    return f"{case.get('case_id')}#{case.get('epoch')}"


# --------------------------------------------------------------------------- the report


def _tiles(totals: Mapping[str, Any]) -> str:
    tiles = [
        ("pass rate", f"{totals['pass_rate']:.0%}"),
        ("cases", totals["cases"]),
        ("passed", totals["passed"]),
        ("failed", totals["failed"]),
        ("errored", totals["errored"]),
        ("false success", totals["false_success"]),
        ("effects dispatched twice", totals.get("effects_dispatched_twice", 0)),
        ("writes left open", totals.get("effects_left_open", 0)),
    ]
    return (
        '<div class="totals">'
        + "".join(
            f'<div class="tile"><span class="muted">{_e(name)}</span><b>{_e(value)}</b></div>'
            for name, value in tiles
        )
        + "</div>"
    )


_FILTERS = (
    '<p class="filters"><button data-show="all">all</button>'
    '<button data-show="failed">failed</button><button data-show="passed">passed</button>'
    '<button data-show="error">errored</button> '
    '<button data-open="all">expand all</button><button data-open="none">collapse all</button>'
    "</p>"
)


def eval_html(document: Mapping[str, Any]) -> str:
    """The report (``loop-actors-eval/1``) as one self-contained HTML page."""
    cases: list[Mapping[str, Any]] = document["cases"]
    scored = [c for c in cases if c["status"] != "error"]
    totals = document["totals"]
    agent = document.get("agent") or {}
    charts = "".join(
        [
            _stacked_bars("cases by terminal reason", _group_rows(document["by_reason"]), _COLOURS),
            _stacked_bars("cases by task class", _group_rows(document["by_task_class"]), _COLOURS),
            _histogram(
                "latency",
                [c["latency_ms"] for c in scored],
                "ms",
                _markers(totals.get("latency_ms")),
            ),
            _histogram("cost", [c["cost"] for c in scored], "cost", _markers(totals.get("cost"))),
            _histogram(
                "tokens", [c["tokens"] for c in scored], "tokens", _markers(totals.get("tokens"))
            ),
            _histogram(
                "steps", [c["steps"] for c in scored], "steps", _markers(totals.get("steps"))
            ),
        ]
    )
    rows = "".join(
        f'<tr data-status="{_e(c["status"])}"><td><a href="#case-{i}">{_e(_case_name(c))}</a>'
        f"</td><td>{_e(c['task_class'])}</td><td>{_badge(c['status'])}</td>"
        f"<td>{_e(c.get('reason') or '-')}</td><td class='n'>{_e(c['steps'])}</td>"
        f"<td class='n'>{_e(c['tool_calls'])}</td><td class='n'>{_e(c['tokens'])}</td>"
        f"<td class='n'>{_number(float(c['cost']))}</td>"
        f"<td class='n'>{_number(float(c['latency_ms']))}</td>"
        f"<td>{_e(_first_failure(c))}</td></tr>"
        for i, c in enumerate(cases)
    )
    table = (
        "<table><thead><tr><th>case</th><th>class</th><th>result</th><th>reason</th>"
        "<th class='n'>steps</th><th class='n'>calls</th><th class='n'>tokens</th>"
        "<th class='n'>cost</th><th class='n'>ms</th><th>first failure</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
    sections = "".join(
        f'<details class="case" id="case-{i}" data-status="{_e(c["status"])}"'
        f"{' open' if c['status'] != 'passed' else ''}><summary>{_badge(c['status'])} "
        f"{_e(_case_name(c))} <span class='muted'>{_e(c.get('reason') or '-')}</span></summary>"
        f"{_case_body(c)}</details>"
        for i, c in enumerate(cases)
    )
    body = (
        f"<h1>eval {_e(document['suite'])}</h1>"
        f'<p class="muted">agent {_e(agent.get("name"))} version {_e(agent.get("version"))} · '
        f"{_e(document['format'])}</p>{_tiles(totals)}"
        f'<h2>charts</h2><div class="charts">{charts}</div>'
        f"<h2>cases</h2>{_FILTERS}{table}<h2>trajectories</h2>{sections}"
    )
    return _page(f"eval {document['suite']}", body)


def _first_failure(case: Mapping[str, Any]) -> str:
    if case.get("error"):
        return str(case["error"])
    failures = case.get("failures") or []
    if not failures:
        return ""
    first = failures[0]
    more = f" (+{len(failures) - 1})" if len(failures) > 1 else ""
    return f"{first.get('expectation')}: {first.get('why')}{more}"


# --------------------------------------------------------------------------- compare


def _side(case: Mapping[str, Any] | None, label: str) -> str:
    if case is None:
        return (
            f'<div class="side"><h3>{_e(label)}</h3><p class="muted">not in this report</p></div>'
        )
    return (
        f'<div class="side"><h3>{_e(label)} {_badge(case["status"])}</h3>{_case_body(case)}</div>'
    )


def _delta(value: float, digits: str = "+.4g") -> str:
    return format(value, digits)


def _intervals(bootstrap: Mapping[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{_e(measure)}</td><td class='n'>{_e(interval['pairs'])}</td>"
        f"<td class='n'>{_delta(interval['mean_delta'])}</td>"
        f"<td class='n'>{_delta(interval['low'])} to {_delta(interval['high'])}</td></tr>"
        for measure, interval in bootstrap.items()
        if interval is not None
    )
    return (
        "<table><thead><tr><th>measure</th><th class='n'>pairs</th><th class='n'>mean Δ (B - A)"
        "</th><th class='n'>95% bootstrap interval</th></tr></thead>"
        f"<tbody>{rows or '<tr><td colspan=4>no scored pair</td></tr>'}</tbody></table>"
    )


def compare_html(
    comparison: Mapping[str, Any],
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    names: tuple[str, str] = ("A", "B"),
) -> str:
    """A comparison (``loop-actors-eval-compare/1``) and both reports' cases, side by side."""
    by_key_a = {(c["case_id"], c["epoch"]): c for c in a["cases"]}
    by_key_b = {(c["case_id"], c["epoch"]): c for c in b["cases"]}
    rows: list[Mapping[str, Any]] = comparison["cases"]
    flips = {
        "broke": comparison["broke"],
        "fixed": comparison["fixed"],
        "same": len(rows) - comparison["broke"] - comparison["fixed"],
    }
    charts = [
        _stacked_bars("flips", [("paired cases", flips)], _FLIP_COLOURS),
        _stacked_bars(
            "results",
            [
                (names[0], _status_counts(by_key_a.values())),
                (names[1], _status_counts(by_key_b.values())),
            ],
            _COLOURS,
        ),
    ]
    for measure, unit in (("latency_ms", "ms"), ("cost", "cost")):
        interval = comparison["bootstrap"].get(measure)
        charts.append(
            _histogram(
                f"Δ{measure} per paired case (B - A)",
                [row[measure] for row in rows if "error" not in row["status"]],
                unit,
                [("mean", interval["mean_delta"])] if interval else [],
                (interval["low"], interval["high"]) if interval else None,
                from_zero=False,
            )
        )
    table_rows = "".join(
        f'<tr data-status="{_e(row["flip"] or "same")}"><td><a href="#pair-{i}">'
        f"{_e(row['case_id'])}#{_e(row['epoch'])}</a></td>"
        f"<td>{_badge(row['flip']) if row['flip'] else ''}</td>"
        f"<td>{_e(row['status'][0])} → {_e(row['status'][1])}</td>"
        f"<td>{_e(row['reason'][0] or '-')} → {_e(row['reason'][1] or '-')}</td>"
        f"<td class='n'>{row['steps']:+d}</td><td class='n'>{row['tool_calls']:+d}</td>"
        f"<td class='n'>{row['tokens']:+d}</td><td class='n'>{_delta(row['cost'])}</td>"
        f"<td class='n'>{_delta(row['latency_ms'], '+.1f')}</td></tr>"
        for i, row in enumerate(rows)
    )
    table = (
        "<table><thead><tr><th>case</th><th>flip</th><th>A → B</th><th>reason</th>"
        "<th class='n'>Δsteps</th><th class='n'>Δcalls</th><th class='n'>Δtokens</th>"
        "<th class='n'>Δcost</th><th class='n'>Δms</th></tr></thead>"
        f"<tbody>{table_rows}</tbody></table>"
    )
    sections = "".join(
        f'<details class="case" id="pair-{i}" data-status="{_e(row["flip"] or "same")}"'
        f"{' open' if row['flip'] else ''}><summary>"
        f"{_badge(row['flip']) + ' ' if row['flip'] else ''}"
        f"{_e(row['case_id'])}#{_e(row['epoch'])} <span class='muted'>"
        f"{_e(row['status'][0])} → {_e(row['status'][1])}</span></summary>"
        f'<div class="sides">{_side(by_key_a.get(key), names[0])}'
        f"{_side(by_key_b.get(key), names[1])}</div></details>"
        for i, row in enumerate(rows)
        for key in [(row["case_id"], row["epoch"])]
    )
    rate = comparison["pass_rate"]
    unpaired = [*comparison["only_in_a"], *comparison["only_in_b"]]
    body = (
        f"<h1>eval compare: {_e(names[0])} → {_e(names[1])}</h1>"
        f'<p class="muted">A: {_e(a.get("suite"))} {_e(_agent(a))} · '
        f"B: {_e(b.get('suite'))} {_e(_agent(b))} · {_e(comparison['format'])}</p>"
        '<div class="totals">'
        f'<div class="tile"><span class="muted">paired</span><b>{comparison["paired"]}</b></div>'
        f'<div class="tile"><span class="muted">pass rate</span><b>{rate["a"]:.0%} → '
        f"{rate['b']:.0%}</b></div>"
        f'<div class="tile"><span class="muted">broke</span><b>{comparison["broke"]}</b></div>'
        f'<div class="tile"><span class="muted">fixed</span><b>{comparison["fixed"]}</b></div>'
        f'<div class="tile"><span class="muted">McNemar exact p</span>'
        f"<b>{comparison['mcnemar_p']:.4g}</b></div></div>"
        + (
            f'<p class="muted">in one report only: {_e(", ".join(unpaired))}</p>'
            if unpaired
            else ""
        )
        + f'<h2>charts</h2><div class="charts">{"".join(charts)}</div>'
        f"<h2>paired bootstrap</h2>{_intervals(comparison['bootstrap'])}"
        f'<h2>cases, flips first</h2><p class="filters"><button data-show="all">all</button>'
        '<button data-show="broke">broke</button><button data-show="fixed">fixed</button>'
        '<button data-show="same">unchanged</button></p>'
        f"{table}<h2>side by side</h2>{sections}"
    )
    return _page(f"eval compare {names[0]} {names[1]}", body)


def _agent(report: Mapping[str, Any]) -> str:
    agent = report.get("agent") or {}
    if not agent:
        return ""
    return f"(agent {agent.get('name')} version {agent.get('version')})"


def _status_counts(cases: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "error": 0}
    for case in cases:
        counts[case["status"]] = counts.get(case["status"], 0) + 1
    return counts
