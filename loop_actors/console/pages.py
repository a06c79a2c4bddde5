"""The console's server-rendered pages: invocations, an invocation, approvals, open effects.

Jinja templates (``loop_actors/console/templates/``, package data) with ``autoescape``:
a goal, an argument or a tool output holding ``<script>`` is shown as text, never run.
The pages carry no inline script: ``/static/console.js`` (ours, served from the
package) sends the forms with the token and follows the live stream.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from aggregates.decisions import TerminalReason
from loop_actors._errors import InvocationNotFoundError, UsageError
from loop_actors.console.api import GROUPS, error_response, parse_filter, parse_group
from loop_actors.console.bulk import BulkAction
from loop_actors.console.guard import COOKIE, token_matches
from loop_actors.console.reads import ConsoleReads
from loop_actors.console.render import CHARTS, PACKAGE, bar_chart, render_html
from projections.trajectory import InvocationStatus

FILTERS = ("id", "agent", "status", "reason", "from", "before", "roots")
"""The list's filters a bulk action over it takes (not its page: ``limit``, ``offset``)."""


def render(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A page from its template (every value escaped)."""
    return HTMLResponse(render_html(name, export=False, **context), status_code)


def page_routes(reads: ConsoleReads, console_token: str) -> list[Route | Mount]:
    """The pages, the login form (for reading pages beyond loopback) and ``/static/``."""

    async def home(request: Request) -> Response:
        return RedirectResponse("/invocations", status_code=303)

    async def invocations(request: Request) -> Response:
        query = dict(request.query_params)
        try:
            where = parse_filter(query)
        except UsageError as error:
            return render("error.html.j2", 400, title="Bad filter", detail=str(error))
        rows = await reads.invocations(where)
        summary: dict[str, dict[str, int]] = {}
        for row in await reads.summary():
            summary.setdefault(row["agent"], {})[row["status"]] = row["count"]
        kept = {k: v for k, v in query.items() if k != "offset" and v}
        pages = {
            "previous": urlencode({**kept, "offset": max(0, where.offset - where.limit)})
            if where.offset > 0
            else None,
            "next": urlencode({**kept, "offset": where.offset + where.limit})
            if len(rows) == where.limit
            else None,
        }
        return render(
            "invocations.html.j2",
            title="Invocations",
            rows=rows,
            where=where,
            statuses=[s.value for s in InvocationStatus],
            reasons=[r.value for r in TerminalReason],
            pages=pages,
            summary=sorted(summary.items()),
            query=query,
            bulk_where=json.dumps({k: v for k, v in kept.items() if k in FILTERS}),
            bulk_actions=[action.value for action in BulkAction],
        )

    async def invocation(request: Request) -> Response:
        invocation_id = request.path_params["invocation_id"]
        try:
            found = await reads.invocation(invocation_id)
        except InvocationNotFoundError:
            found = None
        if found is None:
            return render(
                "error.html.j2", 404, title="Not found", detail=f"no invocation {invocation_id!r}"
            )
        return render("invocation.html.j2", title=invocation_id, inv=found)

    async def approvals(request: Request) -> Response:
        return render("approvals.html.j2", title="Approvals", items=await reads.approvals())

    async def effects(request: Request) -> Response:
        return render("effects.html.j2", title="Open effects", rows=await reads.open_effects())

    async def metrics_page(request: Request) -> Response:
        try:
            by = parse_group(request.query_params.get("by", "reason"))
        except UsageError as error:
            return render("error.html.j2", 400, title="Bad grouping", detail=str(error))
        rows = await reads.metrics(by)
        charts = [
            bar_chart(title, [(row.group, value(row)) for row in rows], unit)
            for title, value, unit in CHARTS
        ]
        return render("metrics.html.j2", title="Metrics", by=by, groups=GROUPS, charts=charts)

    async def login_form(request: Request) -> Response:
        return render("login.html.j2", title="Token", failed=False)

    async def login(request: Request) -> Response:
        # Parsed here: Starlette's form parser needs python-multipart, which the console
        # does not otherwise need.
        body = (await request.body())[:4096].decode("utf-8", "replace")
        token = parse_qs(body).get("token", [""])[0]
        if not token_matches(token, console_token):
            return render("login.html.j2", 401, title="Token", failed=True)
        response = RedirectResponse("/invocations", status_code=303)
        # Secure when served over https (behind a TLS-terminating proxy it names).
        secure = request.url.scheme == "https"
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", path="/", secure=secure
        )
        return response

    routes: list[Route | Mount] = [
        Route("/", home, methods=["GET"]),
        Route("/invocations", invocations, methods=["GET"]),
        Route("/invocations/{invocation_id}", invocation, methods=["GET"]),
        Route("/approvals", approvals, methods=["GET"]),
        Route("/effects", effects, methods=["GET"]),
        Route("/metrics", metrics_page, methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(PACKAGE / "static")), name="static"),
    ]
    return routes


__all__ = ["error_response", "page_routes", "render"]
