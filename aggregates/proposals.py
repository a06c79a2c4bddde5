"""A model's proposal checked: storable, within its size, a decision, its calls valid.

:func:`validate_proposal` is the turn core's check of every reply: the proposal as
a storable value (JSON text parsed, a model dumped), then the decision schema, then
each call against the tool catalogue. A refused proposal becomes its
:class:`~aggregates.decisions.Rejection`, redacted as the tools say.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from aggregates.decisions import (
    Decision,
    Final,
    Handoff,
    Plan,
    Rejection,
    RejectionClass,
    ToolCalls,
    Wait,
    decision_fields,
    parse_decision,
)
from aggregates.handoffs import handoff_problem
from aggregates.planning import plan_problems
from aggregates.redaction import (
    redact_proposal,
    scrub,
)
from aggregates.revalidation import validation_problems
from aggregates.settings import RunSettings
from aggregates.turn_messages import Catalogue
from aggregates.values import (
    NotJsonError,
    UnstorableError,
    check_json,
    describe_error,
    json_size,
    json_text,
    parse_json_text,
    safe_text,
    storable_bound,
    truncated,
    unstorable,
)


def validate_proposal(
    proposal: object, catalogue: Catalogue, settings: RunSettings, *, handoffs_made: int = 0
) -> tuple[Decision, dict[str, dict[str, Any]]] | Rejection:
    """Check a proposal against the decision schema and the tool catalogue.

    Returns the decision and each call's checked arguments (by call id), or the
    proposal's rejection as it is stored. ``handoffs_made``: how many handoffs led to
    this invocation (a handoff past ``MAX_HANDOFFS`` is refused).
    """
    admitted = _admit(proposal, catalogue, settings)
    if isinstance(admitted, Rejection):
        return admitted
    proposal = admitted
    try:
        decision = parse_decision(proposal)
    except ValidationError as error:
        return _rejection(
            proposal,
            catalogue=catalogue,
            problems=[
                (RejectionClass.SCHEMA_INVALID, problem)
                for problem in validation_problems(error, whole="decision")
            ],
        )
    arguments: dict[str, dict[str, Any]] = {}
    problems: list[tuple[RejectionClass, str]] = []
    match decision:
        case Final(answer=answer) if not answer.strip():
            problems.append((RejectionClass.EMPTY_ANSWER, "the final answer is empty"))
        case Handoff(to=to, reason=reason):
            problem = handoff_problem(to, list(settings.handoffs or {}), handoffs_made)
            if problem is not None:
                problems.append((RejectionClass.UNKNOWN_HANDOFF, problem))
            elif not reason.strip():
                problems.append((RejectionClass.SCHEMA_INVALID, "a handoff needs a reason"))
        case Wait(reason=reason) if not reason.strip():
            problems.append((RejectionClass.SCHEMA_INVALID, "a wait needs a reason"))
        case Plan():
            # Each step's arguments are checked as a call's are, keyed ``plan-N``.
            plan_issues, arguments = plan_problems(decision, catalogue, settings.planning)
            problems.extend(plan_issues)
        case ToolCalls(calls=calls):
            if not calls:
                problems.append((RejectionClass.EMPTY_BATCH, "the tool batch is empty"))
            seen: set[str] = set()
            for call in calls:
                if call.id in seen:
                    problems.append(
                        (RejectionClass.DUPLICATE_CALL_ID, f"duplicate call id {call.id!r}")
                    )
                seen.add(call.id)
                if catalogue.effect_of(call.name) is None:
                    problems.append(
                        (
                            RejectionClass.UNKNOWN_TOOL,
                            f"call {call.id}: unknown tool {call.name!r}",
                        )
                    )
                    continue
                try:
                    checked = catalogue.check_arguments(call)
                except ValidationError as error:
                    details = "; ".join(validation_problems(error, whole="arguments"))
                    problems.append(
                        (
                            RejectionClass.INVALID_ARGUMENTS,
                            f"call {call.id}: arguments for {call.name} are invalid: {details}",
                        )
                    )
                    continue
                except Exception as error:  # a validator of the tool's types that broke
                    problems.append(
                        (
                            RejectionClass.INVALID_ARGUMENTS,
                            f"call {call.id}: arguments for {call.name} could not be "
                            f"checked: {describe_error(error)}",
                        )
                    )
                    continue
                # The tool's types may make an unstorable value (e.g. "Infinity" as a float).
                problem = check_json(checked)
                if problem is not None:
                    problems.append(
                        (
                            RejectionClass.VALUE_INVALID,
                            f"call {call.id}: arguments for {call.name} cannot be stored "
                            f"faithfully once validated: {problem}",
                        )
                    )
                    continue
                arguments[call.id] = checked
        case _:
            pass
    if problems:
        return _rejection(proposal, catalogue=catalogue, problems=problems)
    return decision, arguments


def _rejection(
    proposal: object, problems: list[tuple[RejectionClass, str]], catalogue: Catalogue
) -> Rejection:
    """A refused proposal as it is stored: redacted, its problems scrubbed of its secrets."""
    raw, secrets = redact_proposal(_jsonable(proposal), catalogue)
    return Rejection(
        rejection_class=problems[0][0],
        problems=[scrub(problem, secrets) for _, problem in problems],
        raw=raw,
    )


def _admit(proposal: object, catalogue: Catalogue, settings: RunSettings) -> Any:
    """The proposal as a storable value (JSON text parsed, a model dumped), or its rejection.

    A value that cannot be stored faithfully is refused ``value_invalid`` and one
    over ``max_proposal_bytes`` ``too_large``; either is recorded as a stand-in
    (``aggregates.values.unstorable`` / ``truncated``), never in a changed form.
    """
    limit = settings.proposal_limit
    if isinstance(proposal, str | bytes):
        data = proposal.encode("utf-8", "surrogatepass") if isinstance(proposal, str) else proposal
        if len(data) > limit:
            return _refused(
                RejectionClass.TOO_LARGE,
                f"the proposal is {len(data)} bytes, over the limit of {limit}",
                truncated(data, max_bytes=limit, head=False),
            )
        try:
            return parse_json_text(proposal)
        except NotJsonError:
            return proposal  # refused as before: not a decision
        except UnstorableError as error:
            why = f"the proposal cannot be stored faithfully: {error}"
            # Text that cannot be parsed cannot be redacted: only its size and digest.
            return _refused(
                RejectionClass.VALUE_INVALID, why, unstorable(proposal, why, show=False)
            )
    problem: str | None = None
    bound: int | None = None
    if isinstance(proposal, BaseModel):
        # Validated from what it holds, as a dict would be: a decision model built
        # without validation (model_construct) may hold anything.
        try:
            value: Any = decision_fields(proposal)
        except Exception as error:  # a model built without validation may not dump
            value = error
            problem = f"it cannot be read: {safe_text(error)}"
    else:
        value = proposal
    if problem is None:
        # One pass says whether it is storable and bounds its size: only a value
        # whose bound is over the limit is encoded to be measured.
        bound = storable_bound(value)
        if bound is None:
            problem = check_json(value) or "it cannot be stored"
    if problem is not None:
        why = f"the proposal cannot be stored faithfully: {problem}"
        redacted, show = _try_redact(value, catalogue)
        return _refused(RejectionClass.VALUE_INVALID, why, unstorable(redacted, why, show=show))
    if bound is not None and bound <= limit:
        return value
    size = json_size(value)
    if size > limit:
        redacted, show = _try_redact(value, catalogue)
        return _refused(
            RejectionClass.TOO_LARGE,
            f"the proposal is {size} bytes, over the limit of {limit}",
            truncated(json_text(redacted), max_bytes=limit, head=show),
        )
    return value


def _try_redact(value: Any, catalogue: Catalogue) -> tuple[Any, bool]:
    """A refused value redacted for its stand-in, and whether it may be shown."""
    try:
        raw, _ = redact_proposal(value, catalogue)
    except Exception:  # what cannot be redacted is not shown
        return value, False
    return raw, True


def _refused(rejection_class: RejectionClass, problem: str, raw: Any) -> Rejection:
    return Rejection(rejection_class=rejection_class, problems=[problem], raw=raw)


def _jsonable(proposal: object) -> Any:
    # What _admit admitted: plain data (a model was dumped there), or text that is not JSON.
    try:
        return to_jsonable_python(proposal)
    except Exception:
        return repr(proposal)
