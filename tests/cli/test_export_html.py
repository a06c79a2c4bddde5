"""``loop-actors export ID --html FILE``: one self-contained file, values escaped, the audit's verdict.

Bad inputs tried: an unknown invocation, a file in a folder that does not exist, a
store edited by hand (the file says which chain broke; exit 4).
"""

from __future__ import annotations

from pathlib import Path

import trio

from tests.support.audit import tamperable
from tests.support.cli import run_cli
from tests.support.console import HOSTILE, completed_refund


async def _store(tmp_path: Path) -> str:
    db = f"sqlite:///{tmp_path / 'export.db'}"
    with trio.fail_after(30):
        await completed_refund(db, "done")
    return db


async def test_the_export_holds_the_trajectory_ledger_approvals_and_audit(tmp_path: Path) -> None:
    db = await _store(tmp_path)
    result = run_cli("export", "done", "--html", "done.html", cwd=tmp_path, db=db)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("wrote done.html: 2 steps, 1 writes, 2 chains intact")
    page = (tmp_path / "done.html").read_text()
    assert "<script" not in page  # no script of ours, and the tool's output is escaped
    assert HOSTILE not in page
    assert "&lt;script&gt;alert(" in page
    assert "default-src 'none'" in page
    assert "<link" not in page  # self-contained: the style is inline
    assert 'id="ledger"' in page
    assert "committed" in page
    assert ">alice<" in page  # who approved
    assert 'id="audit" class="ok">2 chains intact' in page


async def test_an_unknown_invocation_or_an_unwritable_file_is_a_usage_error(
    tmp_path: Path,
) -> None:
    db = await _store(tmp_path)
    unknown = run_cli("export", "nobody", "--html", "x.html", cwd=tmp_path, db=db)
    unwritable = run_cli("export", "done", "--html", "no/such/x.html", cwd=tmp_path, db=db)
    assert unknown.returncode == 2
    assert "nobody" in unknown.stderr
    assert unwritable.returncode == 2
    assert "cannot write no/such/x.html" in unwritable.stderr
    assert not (tmp_path / "x.html").exists()


async def test_an_edited_store_is_exported_with_the_broken_chain_named(tmp_path: Path) -> None:
    db = await _store(tmp_path)
    connection = tamperable(tmp_path / "export.db")
    with connection:
        connection.execute(
            "UPDATE stored_events SET state = repacked(state, CAST(replace("
            "CAST(plain(state) AS TEXT), 'refund A-1', 'refund Z-9') AS BLOB)) "
            "WHERE originator_id = 'done' AND originator_version = 1"
        )
    connection.close()
    result = run_cli("export", "done", "--html", "done.html", cwd=tmp_path, db=db)
    assert result.returncode == 4, result.stderr
    page = (tmp_path / "done.html").read_text()
    assert 'id="audit" class="error">1 of 2 chains broken' in page
    assert "broken at 1" in page
