"""The console's JSON API under ``/api/`` (docs/reference/console-api.md).

Every decision goes through the runtime's own ``approve`` / ``deny`` / ``clarify`` /
``request_cancel``, as the CLI's do: the rules (the digest must be the waiting batch's,
a decision is taken once) are the runtime's, and its typed errors become status codes
here (:func:`error_response`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, NoReturn

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from aggregates.decisions import TerminalReason
from aggregates.standing import ApprovalRefusal
from aggregates.values import check_json_depth
from loop_actors._errors import (
    ApprovalRefusedError,
    EffectNotFoundError,
    EffectResolutionError,
    InvocationNotFoundError,
    NotWaitingError,
    StoreUnavailableError,
    UsageError,
)
from loop_actors.console.bulk import (
    MAX_BULK,
    BulkAction,
    BulkBody,
    ConsoleRuns,
    NoAgentError,
    bulk_answer,
)
from loop_actors.console.reads import MAX_PAGE, ConsoleReads, InvocationFilter
from loop_actors.console.stream import event_stream, tree_stream
from loop_actors.runtime.runtime import Runtime
from projections.metrics import GroupBy
from projections.trajectory import InvocationStatus

MAX_BODY = 64 * 1024
"""A decision's body is at most this many bytes (``413`` past it)."""


class BadRequestError(UsageError):
    """Raised when a request's query or body is malformed (``400``); nothing is recorded."""


def error_response(error: Exception) -> JSONResponse:
    """The JSON error for one of the runtime's typed errors (others are raised on)."""
    match error:
        case InvocationNotFoundError() | EffectNotFoundError():
            return _error(404, "not_found", str(error))
        case EffectResolutionError():
            return _error(409, "not_resolvable", str(error))
        case ApprovalRefusedError(refusal=ApprovalRefusal.NOT_WAITING):
            return _error(409, "already_decided", f"already decided: {error}")
        case ApprovalRefusedError(refusal=ApprovalRefusal.OTHER_DIGEST):
            return _error(409, "other_digest", str(error))
        case ApprovalRefusedError():
            return _error(409, "conflict", str(error))
        case NotWaitingError():
            return _error(409, "not_waiting", str(error))
        case NoAgentError():
            return _error(409, "no_agent", str(error))
        case StoreUnavailableError():
            return _error(503, "store_unavailable", str(error))
        case UsageError():
            return _error(400, "bad_request", str(error))
        case _:
            raise error


def _error(status: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def parse_filter(query: dict[str, str]) -> InvocationFilter:
    """The list's filters from a query string (``agent``, ``status``, ``reason``, ``roots``...).

    Raises:
        BadRequestError: an unknown status or reason, a limit or offset that is not a
            whole number in range.
    """

    def whole(name: str, default: int, low: int, high: int) -> int:
        text = query.get(name)
        if text is None or text == "":
            return default
        try:
            value = int(text)
        except ValueError:
            raise BadRequestError(f"{name} must be a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise BadRequestError(f"{name} must be {low}..{high}, got {value}")
        return value

    status = query.get("status") or None
    if status is not None and status not in {s.value for s in InvocationStatus}:
        raise BadRequestError(
            f"status must be one of {', '.join(s.value for s in InvocationStatus)}, got {status!r}"
        )
    reason = query.get("reason") or None
    if reason is not None and reason not in {r.value for r in TerminalReason}:
        raise BadRequestError(f"reason must be a terminal reason, got {reason!r}")
    times = {}
    for name in ("from", "before"):
        text = query.get(name) or None
        if text is not None:
            try:
                parsed = datetime.fromisoformat(text)
            except ValueError:
                raise BadRequestError(
                    f"{name} must be an ISO 8601 date or time, got {text!r}"
                ) from None
            if parsed.tzinfo is not None:
                parsed = parsed.astimezone(UTC).replace(tzinfo=None)
            times[name] = parsed.isoformat()
    return InvocationFilter(
        agent=query.get("agent") or None,
        id_prefix=query.get("id") or None,
        started_from=times.get("from"),
        started_before=times.get("before"),
        status=InvocationStatus(status) if status is not None else None,
        reason=TerminalReason(reason) if reason is not None else None,
        roots_only=query.get("roots", "") in ("1", "true", "on"),
        limit=whole("limit", 50, 1, MAX_PAGE),
        offset=whole("offset", 0, 0, 2**62),
    )


GROUPS: tuple[GroupBy, ...] = ("reason", "task-class", "agent", "tree")


def parse_group(text: str) -> GroupBy:
    """The metrics' grouping (``reason``, ``task-class``, ``agent`` or ``tree``).

    Raises:
        BadRequestError: another one.
    """
    for group in GROUPS:
        if text == group:
            return group
    raise BadRequestError(f"by must be one of {', '.join(GROUPS)}, got {text!r}")


async def read_body(request: Request) -> dict[str, Any]:
    """The request's JSON object.

    Raises:
        BadRequestError: not JSON, not an object, or larger than :data:`MAX_BODY`.
    """
    body = await request.body()
    if len(body) > MAX_BODY:
        raise BadRequestError(f"the body is larger than {MAX_BODY} bytes")

    def refuse(constant: str) -> NoReturn:
        raise BadRequestError(f"{constant} is not JSON and cannot be stored faithfully")

    problem = check_json_depth(body.decode("utf-8", "replace"))
    if problem is not None:  # before parsing: no RecursionError on deep nesting
        raise BadRequestError(f"the body cannot be stored as JSON: {problem}")
    try:
        parsed = json.loads(body or b"{}", parse_constant=refuse)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BadRequestError(f"the body is not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise BadRequestError("the body must be a JSON object")
    return parsed


def _text(body: dict[str, Any], name: str, *, required: bool) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise BadRequestError(f"{name!r} is required")
        return None
    if not isinstance(value, str):
        raise BadRequestError(f"{name!r} must be a string")
    return value


Handler = Callable[[Request], Awaitable[Response]]


def _typed(handler: Handler) -> Handler:
    """The handler, with the runtime's typed errors answered as JSON errors."""

    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except (UsageError, StoreUnavailableError) as error:
            return error_response(error)

    return answer


def parse_bulk_body(body: dict[str, Any]) -> BulkBody:
    """A bulk action's body: ``where`` (the list's filters), ``dry_run``, ``by``, ``confirm``...

    Raises:
        BadRequestError: ``where`` is not an object of strings or not a filter the list
            takes, ``dry_run`` is not a boolean, or (without a dry run) ``by`` or
            ``confirm`` is missing.
    """
    where = body.get("where", {})
    if not isinstance(where, dict) or not all(isinstance(v, str) for v in where.values()):
        raise BadRequestError("'where' must be an object of filters (strings), as the list's")
    dry_run = body.get("dry_run", True)
    if not isinstance(dry_run, bool):
        raise BadRequestError("'dry_run' must be true or false")
    return BulkBody(
        where=parse_filter({**where, "limit": str(MAX_BULK), "offset": "0"}),
        dry_run=dry_run,
        by=_text(body, "by", required=not dry_run),
        reason=_text(body, "reason", required=False),
        confirm=_text(body, "confirm", required=not dry_run),
    )


def api_routes(runtime: Runtime, reads: ConsoleReads, runs: ConsoleRuns) -> list[Route]:
    """The routes of ``/api/``."""

    async def invocations(request: Request) -> Response:
        where = parse_filter(dict(request.query_params))
        rows = await reads.invocations(where)
        more = len(rows) == where.limit
        return JSONResponse(
            {
                "invocations": rows,
                "limit": where.limit,
                "offset": where.offset,
                "next_offset": where.offset + where.limit if more else None,
            }
        )

    async def invocation(request: Request) -> Response:
        invocation_id = request.path_params["invocation_id"]
        found = await reads.invocation(invocation_id)
        if found is None:
            raise InvocationNotFoundError(invocation_id)
        return JSONResponse(found)

    async def metrics(request: Request) -> Response:
        by = parse_group(request.query_params.get("by", "reason"))
        rows = await reads.metrics(by)
        return JSONResponse({"by": by, "groups": [row.model_dump(mode="json") for row in rows]})

    async def summary(request: Request) -> Response:
        return JSONResponse({"summary": await reads.summary()})

    async def approvals(request: Request) -> Response:
        return JSONResponse({"approvals": await reads.approvals()})

    async def effects(request: Request) -> Response:
        status = request.query_params.get("status", "open")
        if status != "open":
            raise BadRequestError(f"status must be open (the open effects), got {status!r}")
        return JSONResponse({"effects": await reads.open_effects()})

    async def decide(request: Request) -> Response:
        invocation_id = request.path_params["invocation_id"]
        action = request.path_params["action"]
        if action not in ACTIONS:
            return _error(404, "not_found", f"no action {action!r} (one of {', '.join(ACTIONS)})")
        body = await read_body(request)
        by = _text(body, "by", required=action in ("approve", "deny"))
        match action:
            case "approve":
                digest = _text(body, "digest", required=True)
                assert digest is not None
                assert by is not None
                await runtime.approve(
                    invocation_id, digest=digest, by=by, note=_text(body, "note", required=False)
                )
                return _recorded(invocation_id, "approved", by)
            case "deny":
                reason = _text(body, "reason", required=True)
                assert reason is not None
                assert by is not None
                await runtime.deny(invocation_id, by=by, reason=reason)
                return _recorded(invocation_id, "denied", by)
            case "clarify":
                answer = _text(body, "answer", required=True)
                assert answer is not None
                await runtime.clarify(invocation_id, answer=answer, by=by)
                return _recorded(invocation_id, "clarified", by)
            case _:
                result = await runtime.request_cancel(
                    invocation_id, by=by, reason=_text(body, "reason", required=False)
                )
                return JSONResponse({"invocation_id": invocation_id, "result": result.value})

    async def events(request: Request) -> Response:
        return await event_stream(runtime, request)

    async def tree_events(request: Request) -> Response:
        return await tree_stream(runtime, request)

    async def resolve_effect(request: Request) -> Response:
        body = await read_body(request)
        outcome = _text(body, "resolution", required=True)
        if outcome not in ("committed", "rejected"):
            raise BadRequestError(f"'resolution' must be committed or rejected, got {outcome!r}")
        by = _text(body, "by", required=True)
        assert by is not None
        resolved = await runtime.resolve_effect(
            request.path_params["effect_key"],
            committed=outcome == "committed",
            rejected=outcome == "rejected",
            receipt=body.get("receipt"),
            reason=_text(body, "reason", required=False),
            by=by,
        )
        return JSONResponse(resolved.model_dump(mode="json"))

    async def bulk(request: Request) -> Response:
        name = request.path_params["action"]
        if name not in {action.value for action in BulkAction}:
            return _error(
                404, "not_found", f"no bulk action {name!r} (one of {', '.join(BulkAction)})"
            )
        body = parse_bulk_body(await read_body(request))
        return await bulk_answer(BulkAction(name), body, reads, runs)

    return [
        Route("/api/invocations", _typed(invocations), methods=["GET"]),
        Route("/api/invocations/{invocation_id}", _typed(invocation), methods=["GET"]),
        Route("/api/invocations/{invocation_id}/events", _typed(events), methods=["GET"]),
        Route("/api/invocations/{invocation_id}/tree/events", _typed(tree_events), methods=["GET"]),
        Route(
            "/api/invocations/{invocation_id}/{action:str}",
            _typed(decide),
            methods=["POST"],
        ),
        Route("/api/bulk/{action:str}", _typed(bulk), methods=["POST"]),
        Route("/api/approvals", _typed(approvals), methods=["GET"]),
        Route("/api/summary", _typed(summary), methods=["GET"]),
        Route("/api/metrics", _typed(metrics), methods=["GET"]),
        Route("/api/effects", _typed(effects), methods=["GET"]),
        Route("/api/effects/{effect_key}/resolve", _typed(resolve_effect), methods=["POST"]),
    ]


ACTIONS = ("approve", "deny", "clarify", "cancel")


def _recorded(invocation_id: str, decision: str, by: str | None) -> JSONResponse:
    return JSONResponse(
        {
            "invocation_id": invocation_id,
            "recorded": decision,
            "by": by,
            "next": "a worker resumes it (or: loop-actors resume ID --agent MODULE:ATTR)",
        }
    )
