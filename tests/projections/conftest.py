"""The read models' databases the tests of this folder ask for (``views``): SQLite, then PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import postgres_admin_url
from tests.support.read_model_stores import BACKENDS, ReadModelDatabases


@pytest.fixture(params=BACKENDS)
def views(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReadModelDatabases]:
    """The test's read models on SQLite, then on PostgreSQL (in the store's own database)."""
    admin = postgres_admin_url() if request.param == "postgresql" else None
    databases = ReadModelDatabases(request.param, tmp_path, admin)
    yield databases
    databases.close()
