"""The ``audit`` commands: verify the hash chains and the log, write checkpoints and keys."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from aggregates.audit_coverage import Provenance
from loop_actors._errors import UsageError
from loop_actors._terminal import terminal_safe
from loop_actors.audit.checkpoint import (
    CheckpointReport,
    Commitment,
    LogHead,
    Verdict,
    check_signature,
    checkpoint_note,
    generate_key,
    load_signing_key,
    load_verifier_key,
    log_head,
    parse_checkpoint,
    verify_log,
)
from loop_actors.audit.checkpointer import (
    Checkpointer,
    CheckpointSettings,
    DirectoryMark,
    verify_directory,
)
from loop_actors.audit.verified_state import (
    default_state_path,
    load_state,
    next_state,
    save_state,
)
from loop_actors.audit.verify import Coverage, verify_all, verify_tree
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.reading import open_for_reading


def _audit_keygen(args: argparse.Namespace) -> int:
    private, public = Path(args.out), Path(args.out + ".pub")
    for path in (private, public):
        if path.exists():
            raise UsageError(f"{path} exists: keys are never overwritten")
    key = generate_key(args.name)
    try:
        descriptor = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(key.encoded())
        public.write_text(key.verifier().encoded(), encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write the key files: {error}") from error
    print(f"wrote {private} (keep it secret) and {public} (give it to verifiers)")
    return ExitCode.OK


def _audit_checkpoint(args: argparse.Namespace) -> int:
    key = load_signing_key(Path(args.key)) if args.key else None
    store = open_for_reading(args.db)
    try:
        if args.checkpoint_dir:
            settings = CheckpointSettings(
                Path(args.checkpoint_dir), Path(args.key) if args.key else None
            )
            written = Checkpointer(store, settings).write()
            if written is None:
                print(f"{args.checkpoint_dir}: its last checkpoint covers every row already")
            else:
                print(f"wrote {written}{'' if key else ' (unsigned)'}")
            return ExitCode.OK
        size, head = log_head(store)
        note = checkpoint_note(f"loop-actors/{store.store_id}", size, head, key)
    finally:
        store.close()
    if args.out:
        try:
            Path(args.out).write_text(note, encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write {args.out}: {error}") from error
        print(f"checkpoint of {size} rows, head {head}{'' if key else ' (unsigned)'}: {args.out}")
    else:
        sys.stdout.write(note)
    return ExitCode.OK


_PROVENANCE = {
    Provenance.VERIFIED: "its source's head at the fork point verified",
    Provenance.SOURCE_NOT_IN_STORE: "source not in this store",
    Provenance.SOURCE_BROKEN: "source broken before the fork point (not checked)",
    Provenance.SOURCE_HEAD_MISMATCH: "its source's head at the fork point differs",
    Provenance.SOURCE_TRUNCATED: "its source has no event at the fork point",
}
"""How a fork's provenance reads after its ``ok`` line (the findings are ``BROKEN`` lines)."""

_SIGNED = {
    "verified": "signature verified",
    "not checked": "signature not checked (no --key)",
    "unsigned": "unsigned",
    "bad": "bad signature",
    "local": "last verified",
}


def _log_line(report: CheckpointReport) -> str:
    """One text line for a finding (or the ``ok``) of the log, a checkpoint or a directory."""
    verdict = f"{report.verdict.value:<9}"
    problem = f": {report.problem}" if report.problem else ""
    if report.kind == "log":
        if report.ok:
            return f"{verdict} log        size={report.store_size} head={report.head}"
        return f"{verdict} log        at notification {report.position}{problem}"
    if report.kind == "checkpoint_chain":
        where = f"at checkpoint {report.position}" if report.position else "chained"
        return f"{verdict} checkpoints {report.source}  {where}{problem}"
    label = "verified  " if report.signed == "local" else "checkpoint"
    signed = _SIGNED.get(report.signed or "", "")
    return (
        f"{verdict} {label} {report.source}  size={report.size} store={report.store_size}  "
        f"{signed}{problem}"
    )


def _audit_verify(args: argparse.Namespace) -> int:
    if args.key and not (args.against or args.checkpoint_dir):
        raise UsageError("--key goes with --against FILE or --checkpoint-dir DIR")
    verifier = load_verifier_key(Path(args.key)) if args.key else None
    found: list[CheckpointReport] = []
    commitments: list[Commitment] = []
    if args.against:
        checkpoint = parse_checkpoint(Path(args.against))
        signed, bad = check_signature(checkpoint, verifier, args.against)
        if bad is not None:
            found.append(bad)
        else:
            commitments.append(
                Commitment(
                    args.against, checkpoint.origin, checkpoint.size, checkpoint.head, signed
                )
            )
    store = open_for_reading(args.db)
    coverage: Coverage | None = None
    head: LogHead | None = None
    state_path: Path | None = None
    marks: dict[Path, DirectoryMark | None] = {}
    directory_sources: list[str] = []
    try:
        whole = not args.invocation_id
        if whole and not args.no_state and store.store_id is not None:
            state_path = Path(args.state) if args.state else default_state_path(store.store_id)
        state = load_state(state_path, store.store_id or "") if state_path else None
        if state is not None:
            commitments.append(
                Commitment(
                    str(state_path),
                    f"loop-actors/{state.store_id}",
                    state.size,
                    state.head,
                    "local",
                )
            )
        if args.checkpoint_dir:
            directory = Path(args.checkpoint_dir)
            chain, of_directory, mark = verify_directory(
                directory, verifier, state.mark(directory) if state else None
            )
            found += chain
            commitments += of_directory
            directory_sources = [commitment.source for commitment in of_directory]
            marks[directory] = mark
            if not chain:
                found.append(
                    CheckpointReport(
                        kind="checkpoint_chain",
                        verdict=Verdict.OK,
                        source=str(directory),
                        store_size=0,
                        problem=None,
                    )
                )
        if args.invocation_id:
            reports = verify_tree(store, args.invocation_id)
        else:
            reports, coverage = verify_all(store)
        if whole or commitments:
            of_log, head = verify_log(store, commitments)
            found += of_log
    finally:
        store.close()
    for report in reports:
        if args.json:
            print(report.model_dump_json())
        elif report.intact:
            detail = (
                f"version={report.events}"
                if report.kind == "snapshot"
                else f"events={report.events}  head={report.head_hash}"
            )
            if report.provenance is not None:
                detail += f"  forked from {report.forked_from}: {_PROVENANCE[report.provenance]}"
            print(f"ok      {report.kind:<10} {terminal_safe(report.id)}  {detail}")
        else:
            where = f"at position {report.broken_at}: " if report.broken_at is not None else ""
            if report.kind == "snapshot":
                where = f"version {report.broken_at}: "
            print(terminal_safe(f"BROKEN  {report.kind:<10} {report.id}  {where}{report.problem}"))
    broken = [r for r in reports if not r.intact]
    uncovered = coverage is not None and coverage.rows + coverage.snapshots != coverage.store_rows
    if args.json:
        if coverage is not None:
            print(coverage.model_dump_json())
    else:
        print(f"{len(reports) - len(broken)} intact, {len(broken)} broken")
        if coverage is not None:
            print(
                f"every stored row checked: {coverage.rows} events of {coverage.invocations} "
                f"invocations, {coverage.effects} effects and {coverage.cancel_requests} cancel "
                f"requests; {coverage.snapshots} snapshots"
            )
            if uncovered:
                print(
                    f"BROKEN  the store holds {coverage.store_rows} rows, "
                    f"{coverage.rows + coverage.snapshots} were checked"
                )
    if head is not None and not any(r.kind == "log" for r in found):
        found.insert(
            0,
            CheckpointReport(
                kind="log",
                verdict=Verdict.OK,
                source="log",
                size=head.size,
                store_size=head.size,
                head=head.head,
            ),
        )
    # In text, a directory's checkpoints that agree are summed up by its last one.
    quiet = set(directory_sources[:-1])
    for finding in found:
        if args.json:
            print(finding.model_dump_json())
        elif finding.kind == "checkpoint_chain" and finding.ok:
            count = len(directory_sources)
            many = f"{count} checkpoints, the last one below" if count != 1 else "1 checkpoint"
            print(terminal_safe(f"{_log_line(finding)}: {many}"))
        elif not (finding.ok and finding.source in quiet):
            print(terminal_safe(_log_line(finding)))
    findings = [finding for finding in found if not finding.ok]
    if not (broken or uncovered or findings) and state_path is not None and head is not None:
        assert store.store_id is not None
        try:
            save_state(
                state_path,
                next_state(state, store.store_id, head, marks),
            )
        except OSError as error:
            print(
                f"loop-actors: warning: cannot save the last-verified state {state_path}: "
                f"{error}; the next verify cannot check that the log only grew",
                file=sys.stderr,
            )
    return ExitCode.TAMPERED if broken or uncovered or findings else ExitCode.OK


def run(args: argparse.Namespace) -> int:
    """``audit verify``, ``audit checkpoint`` or ``audit keygen``."""
    match args.audit_command:
        case "keygen":
            return _audit_keygen(args)
        case "checkpoint":
            return _audit_checkpoint(args)
        case _:
            return _audit_verify(args)
