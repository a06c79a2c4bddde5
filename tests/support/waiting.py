"""Waiting, in a test that drives real processes, for something the store or a file shows."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``done`` every 0.1 s until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.1)
    raise AssertionError(f"not {what} after {timeout_s} s")
