"""Check a loop-actors store against a checkpoint note, with no loop-actors installed.

Usage: python verify_checkpoint.py STORE.db CHECKPOINT.txt [KEYFILE.pub]

Uses only the standard library and ``cryptography`` (for the Ed25519 signature),
following docs/reference/audit-format.md: it checks the note's signature, then
recomputes the global log chain over the store's first ``size`` rows (in
notification order) and compares the head. Exit 0 ok, 4 a finding, 2 bad input.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
import sys
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

GENESIS = "0" * 64


def signature_ok(note: str, vkey: str) -> bool:
    """Whether the note carries a valid Ed25519 signature by the verifier key ``vkey``."""
    name, key_id, encoded = vkey.strip().split("+", 2)
    raw = base64.b64decode(encoded)
    public = raw[1:]
    text, _, signatures = note.partition("\n\n")
    for line in signatures.splitlines():
        signer, blob = line.removeprefix("\u2014 ").split(" ")
        signature = base64.b64decode(blob)
        if signer != name or signature[:4].hex() != key_id:
            continue
        try:
            Ed25519PublicKey.from_public_bytes(public).verify(signature[4:], (text + "\n").encode())
        except InvalidSignature:
            return False
        return True
    return False


def head_of(db: Path, size: int) -> tuple[int, str]:
    """(rows read, head link) over the store's first ``size`` rows."""
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = connection.execute(
        "SELECT rowid, originator_id, originator_version, topic, state FROM stored_events "
        "ORDER BY rowid LIMIT ?",
        (size,),
    ).fetchall()
    connection.close()
    link = GENESIS
    for notification_id, originator_id, version, topic, state in rows:
        leaf = json.dumps(
            [notification_id, originator_id, version, topic, hashlib.sha256(state).hexdigest()],
            separators=(",", ":"),
            ensure_ascii=True,
        )
        link = hashlib.sha256(link.encode() + b"\n" + leaf.encode()).hexdigest()
    return len(rows), link


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    note = Path(argv[2]).read_text(encoding="utf-8")
    origin, size_text, root = note.split("\n")[:3]
    if len(argv) == 4 and not signature_ok(note, Path(argv[3]).read_text(encoding="utf-8")):
        print("BAD SIGNATURE")
        return 4
    size = int(size_text)
    read, head = head_of(Path(argv[1]), size)
    if read < size:
        print(f"TRUNCATED {origin}: {read} rows, the checkpoint commits to {size}")
        return 4
    if head != base64.b64decode(root).hex():
        print(f"DIFFERENT {origin}: the first {size} rows do not give the checkpoint's head")
        return 4
    print(f"OK {origin}: {size} rows, head {head}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
