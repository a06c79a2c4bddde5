"""``InvocationStarted.trace_parent`` holds W3C trace-context ids, and nothing else.

Bad inputs tried: all-zero ids (the trace context's invalid id), upper-case hex, ids one
digit short or long, non-hex characters.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from aggregates.invocation import TraceParent

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def test_a_valid_trace_context_is_kept_as_given() -> None:
    parent = TraceParent(trace_id=TRACE, span_id=SPAN)
    assert (parent.trace_id, parent.span_id) == (TRACE, SPAN)


@pytest.mark.parametrize(
    ("trace_id", "span_id"),
    [
        ("0" * 32, SPAN),
        (TRACE, "0" * 16),
        (TRACE.upper(), SPAN),
        (TRACE[:-1], SPAN),
        (TRACE + "a", SPAN),
        (TRACE, SPAN[:-1]),
        (TRACE, "z" * 16),
    ],
)
def test_an_id_that_is_not_a_valid_trace_context_id_is_refused(trace_id: str, span_id: str) -> None:
    with pytest.raises(ValidationError):
        TraceParent(trace_id=trace_id, span_id=span_id)
