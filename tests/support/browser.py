"""Debian's Chromium driven by Playwright, for the tests of pages (eval reports, the console).

``/usr/bin/chromium`` (``.ci/test`` installs it when missing): a module that imports
this is skipped without it, unless ``$LOOP_ACTORS_REQUIRE_BROWSER`` is set (CI), when it
fails. Screenshots are kept as test artefacts under ``test-artifacts/`` (ignored by git).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

playwright_api = pytest.importorskip("playwright.sync_api")

if not CHROMIUM.exists():
    if os.environ.get("LOOP_ACTORS_REQUIRE_BROWSER"):
        raise RuntimeError(f"{CHROMIUM} is missing: apt-get install chromium")
    pytest.skip(f"{CHROMIUM} is missing", allow_module_level=True)


@contextmanager
def launched_browser() -> Iterator[Any]:
    """Headless Chromium, for the block (a module-scoped fixture's body)."""
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield launched
        launched.close()


def screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    """A full-page screenshot in ``tmp_path``, copied to ``test-artifacts/``."""
    shot = tmp_path / name
    page.screenshot(path=str(shot), full_page=True)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / name)
    assert shot.stat().st_size > 10_000
    return shot
