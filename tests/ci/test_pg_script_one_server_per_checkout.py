"""``.ci/pg.sh`` gives each checkout its own PostgreSQL server: folder and port.

Two copies of the script in two folders (two checkouts) name two servers, start two,
and stopping one leaves the other answering: two test runs on one machine no longer
share a server that the first to finish stops. A start that promises to stop the
server at its end (``LOOP_ACTORS_PG_STOP_AT_EXIT=1``, as ``.ci/test`` does) is recorded,
so that ``.ci/test`` can refuse a second run on it. The shared server of the other
tests (``$LOOP_ACTORS_TEST_PG``) is never touched: the test first checks that neither
copy names its port. Bad inputs tried: a port given in ``LOOP_ACTORS_PG_PORT`` that
another server holds (refused, nothing started).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from tests.conftest import postgres_admin_url

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "pg.sh"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOP_ACTORS_PG_")}
    env.update(extra)
    return env


def pg(checkout: Path, action: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(checkout / ".ci" / "pg.sh"), action],
        env=_env(**extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def root_of(checkout: Path) -> Path:
    """The folder the script derives from the checkout's path."""
    digest = hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()[:8]
    return Path("/tmp") / f"loop-actors-pg-{checkout.name}-{digest}"  # noqa: S108 (the script's)


def answers(url: str) -> str:
    with psycopg.connect(url, connect_timeout=5) as connection:
        row = connection.execute("SHOW data_directory").fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture
def checkouts(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Two checkouts holding the script; their servers stopped and folders removed afterwards."""
    shared = postgres_admin_url()  # skipped (or failed) as every PostgreSQL test is
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")) and os.geteuid() != 0:
        pytest.skip("PostgreSQL is not installed and this user cannot install it")
    made = []
    for name in ("checkout-a", "checkout-b"):
        (tmp_path / name / ".ci").mkdir(parents=True)
        shutil.copy(SCRIPT, tmp_path / name / ".ci" / "pg.sh")
        made.append(tmp_path / name)
    a, b = made
    ports = {urlsplit(pg(c, "url").stdout.strip()).port for c in (a, b)}
    # Never go on with a script that names the shared server: stopping it would stop theirs.
    assert urlsplit(shared).port not in ports
    assert len(ports) == 2
    try:
        yield a, b
    finally:
        for checkout in (a, b):
            if urlsplit(pg(checkout, "url").stdout.strip()).port != urlsplit(shared).port:
                pg(checkout, "stop")
            shutil.rmtree(root_of(checkout), ignore_errors=True)


def test_two_checkouts_get_two_servers_and_one_stopping_leaves_the_other(
    checkouts: tuple[Path, Path],
) -> None:
    a, b = checkouts
    for checkout in (a, b):
        started = pg(checkout, "start")
        assert started.returncode == 0, started.stderr
        assert f"(data {root_of(checkout)}/data)" in started.stderr
        assert pg(checkout, "status").returncode == 0
    url_a, url_b = (pg(c, "url").stdout.strip() for c in (a, b))
    assert url_a != url_b
    assert answers(url_a) == f"{root_of(a)}/data"
    assert answers(url_b) == f"{root_of(b)}/data"

    assert pg(a, "stop").returncode == 0
    assert pg(a, "status").returncode != 0
    assert pg(b, "status").returncode == 0
    assert answers(url_b) == f"{root_of(b)}/data"
    assert pg(a, "url").stdout.strip() == url_a  # its port is kept for the next start
    assert pg(a, "start").returncode == 0
    assert answers(url_a) == f"{root_of(a)}/data"


def test_a_start_that_stops_at_exit_is_recorded_while_its_starter_lives(
    checkouts: tuple[Path, Path],
) -> None:
    a, _ = checkouts
    starter = subprocess.Popen(
        ["bash", "-c", f"bash {a / '.ci' / 'pg.sh'} start && echo started && exec sleep 120"],
        env=_env(LOOP_ACTORS_PG_STOP_AT_EXIT="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        assert starter.stdout.readline().strip() == "started"
        assert pg(a, "owner").stdout.strip() == str(starter.pid)
    finally:
        starter.kill()
        starter.communicate()
    assert pg(a, "owner").stdout.strip() == ""  # its starter is gone: nobody will stop it
    assert pg(a, "stop").returncode == 0
    assert pg(a, "start").returncode == 0
    assert pg(a, "owner").stdout.strip() == ""  # started by hand: left running


def test_a_port_that_another_server_holds_is_refused(checkouts: tuple[Path, Path]) -> None:
    a, b = checkouts
    assert pg(a, "start").returncode == 0
    taken = str(urlsplit(pg(a, "url").stdout.strip()).port)
    refused = pg(b, "start", LOOP_ACTORS_PG_PORT=taken)
    assert refused.returncode != 0
    assert f"port {taken} (LOOP_ACTORS_PG_PORT) is taken by another server" in refused.stderr
    assert pg(b, "status").returncode != 0
