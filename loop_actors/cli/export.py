"""``export ID --html FILE``: one self-contained HTML file of an invocation.

The console's invocation page, with its style inline and no script (its own
Content-Security-Policy allows nothing else), plus the invocation's effect ledger and
the audit of its chains (``audit verify ID``). Values are escaped as on the console.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loop_actors._errors import InvocationNotFoundError, UsageError
from loop_actors.audit.verify import verify_invocation
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.reading import note, open_for_reading
from loop_actors.console.reads import audit_verdict, invocation_view
from loop_actors.console.render import inline_css, render_html
from loop_actors.store.read_models import open_read_runner


def run(args: argparse.Namespace) -> int:
    """Write the file; exit 0, or 4 when the audit finds a chain broken (the file says which)."""
    invocation_id = args.invocation_id
    store = open_for_reading(args.db)
    try:
        events = store.events(invocation_id)
        invocation = store.get(invocation_id)
        runner = open_read_runner(store, args.views, note=note)
        try:
            runner.catch_up()
            view = invocation_view(
                runner, invocation_id=invocation_id, events=events, invocation=invocation
            )
        finally:
            runner.close()
        if view is None:
            raise InvocationNotFoundError(invocation_id)
        reports = verify_invocation(store, invocation_id)
        ledger = [_ledger_row(effect) for effect in store.effects_of(invocation_id)]
    finally:
        store.close()
    audit = audit_verdict(invocation_id, reports)
    page = render_html(
        "invocation.html.j2",
        export=True,
        css=inline_css(),
        title=invocation_id,
        exported_at=datetime.now(UTC).isoformat(timespec="seconds"),
        inv={**view, "audit": audit},
        ledger=ledger,
    )
    target = Path(args.html)
    try:
        target.write_text(page, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {target}: {error.strerror or error}") from None
    print(f"wrote {target}: {len(view['steps'])} steps, {len(ledger)} writes, {audit['summary']}")
    return ExitCode.OK if audit["intact"] else ExitCode.TAMPERED


def _ledger_row(effect: Any) -> dict[str, Any]:
    return {
        "key": effect.key,
        "step": effect.step,
        "call_id": effect.call_id,
        "tool": effect.tool,
        "status": effect.status.value,
        "attempt": effect.attempt,
        "by": effect.resolved_by,
        "receipt": effect.receipt,
    }
