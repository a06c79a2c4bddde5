"""The API reference lists the whole public API, and no doc sends users to a private module."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import loop_actors
from tests.support.docs import ROOT, doc_pages

API_REFERENCE = ROOT / "docs" / "reference" / "api.md"


def test_every_exported_name_is_in_the_api_reference() -> None:
    """A name in ``loop_actors.__all__`` must appear in backticks (``Name`` or ``loop_actors.Name``)."""
    text = API_REFERENCE.read_text()
    missing = [
        name
        for name in loop_actors.__all__
        if not re.search(r"`(?:loop_actors\.)?" + re.escape(name) + r"(?![\w])", text)
    ]
    assert not missing, f"docs/reference/api.md does not list {missing}"


def test_every_public_member_of_the_runtime_is_in_its_reference_section() -> None:
    """Each method, property and attribute of a ``Runtime`` not named ``_...`` is documented.

    As ``runtime.NAME`` in the ``Runtime`` section (``driver``, ``with_driver`` and
    ``holder`` were missing once).
    """
    text = API_REFERENCE.read_text()
    section = text[text.index("### `Runtime`") : text.index("### `Worker`")]
    runtime = loop_actors.Runtime("memory://")
    members = {name for name in [*dir(runtime), *vars(runtime)] if not name.startswith("_")}
    missing = sorted(
        name for name in members if not re.search(rf"runtime\.{name}(?![\w])", section)
    )
    assert not missing, f"the Runtime section of docs/reference/api.md does not list {missing}"


def test_every_exported_name_is_importable() -> None:
    """``__all__`` names only what the package really has."""
    assert [name for name in loop_actors.__all__ if not hasattr(loop_actors, name)] == []


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_doc_names_a_private_module(page: Path) -> None:
    """``loop_actors.store.store``, ``loop_actors.store.views``... are private: docs name public ones."""
    private = re.findall(r"loop_actors\._(?!_)\w*", page.read_text())
    assert not private, f"{page.relative_to(ROOT)} sends users to {sorted(set(private))}"
