"""Errors of the pure domain."""

from __future__ import annotations


class AggregateError(Exception):
    """Raised when the domain refuses something; the root of this package's errors."""


class IllegalTransitionError(AggregateError):
    """Raised when an event is not legal in the aggregate's current state; nothing changes."""
