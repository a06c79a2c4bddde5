"""Models built without validation, as user code can build them: ``model_construct``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


def constructed(cls: type[M], **fields: Any) -> M:
    """``cls.model_construct(**fields)``: an instance of ``cls`` that may hold anything.

    Typed loosely on purpose: the point is a field of the wrong type, or none.
    """
    return cls.model_construct(**fields)


NOT_USAGES = [
    pytest.param(
        SimpleNamespace(input_tokens=1, output_tokens=1, cost=0.0, latency_ms=0.0, attempts=None),
        id="not-a-usage-with-every-figure",
    ),
    pytest.param("usage", id="text"),
]
"""Usages a ``ModelReply.model_construct`` may carry that are not a ``Usage`` at all."""
