"""The options of ``audit verify``, ``audit checkpoint`` and ``audit keygen``."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, CliParser, db_option


def _add_audit(audit: argparse.ArgumentParser) -> None:
    audit_commands = audit.add_subparsers(
        dest="audit_command", required=True, parser_class=CliParser
    )
    verify = audit_commands.add_parser(
        "verify", help="check the hash chains of one invocation (and its effects) or of all"
    )
    verify.add_argument("invocation_id", metavar="ID", nargs="?", help="default: every stored row")
    verify.add_argument("--json", action="store_true", help="one JSON report a line")
    verify.add_argument(
        "--against", metavar="FILE", help="also check the log against this checkpoint note"
    )
    verify.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="also check DIR's chain of checkpoints, and the log against each of them",
    )
    verify.add_argument(
        "--key", metavar="KEYFILE.pub", help="the verifier key the checkpoints must be signed with"
    )
    state = verify.add_mutually_exclusive_group()
    state.add_argument(
        "--state",
        metavar="FILE",
        help="the last-verified state to check against and update (default: "
        "$XDG_STATE_HOME/loop-actors/verified/STORE-ID.json)",
    )
    state.add_argument(
        "--no-state", action="store_true", help="neither read nor write a last-verified state"
    )
    db_option(verify)
    checkpoint = audit_commands.add_parser(
        "checkpoint", help="write the log's size and head as a (signed) C2SP checkpoint note"
    )
    checkpoint.add_argument("--key", metavar="KEYFILE", help="sign with this private key file")
    where = checkpoint.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="FILE", help="write the note here (default: stdout)")
    where.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="add it to DIR's chain of checkpoints (as the runtime's --checkpoint-dir does)",
    )
    db_option(checkpoint)
    keygen = audit_commands.add_parser(
        "keygen", help="write a new Ed25519 signing key file and KEYFILE.pub beside it"
    )
    keygen.add_argument("--out", metavar="KEYFILE", required=True, help="the private key file")
    keygen.add_argument(
        "--name", default="loop-actors", help="the key's name (default: loop-actors)"
    )


ARGUMENTS: dict[str, AddArguments] = {"audit": _add_audit}
