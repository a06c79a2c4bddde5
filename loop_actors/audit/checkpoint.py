r"""Checkpoints of the global log chain, as C2SP signed notes, and verification against one.

A checkpoint (C2SP ``tlog-checkpoint``) is the note text

    <origin>\n<size>\n<base64 of the 32-byte head link>\n

followed, when signed, by a blank line and one signature line (C2SP
``signed-note``, Ed25519, signature type 0x01):

    — <key name> <base64(key id (4 bytes) || Ed25519 signature of the text)>\n

where the key id is ``SHA-256(name || 0x0A || 0x01 || public key)[:4]``. The key files
use the formats of Go's ``golang.org/x/mod/sumdb/note``: the private key
``PRIVATE+KEY+<name>+<hex id>+<base64(0x01 || 32-byte seed)>`` and the verifier key
``<name>+<hex id>+<base64(0x01 || 32-byte public key)>``. The origin is
``loop-actors/<store id>``.

Extension lines (C2SP: optional lines after the head, covered by the signature) that
a checkpoint of a checkpoint directory carries (:mod:`loop_actors.audit.checkpointer`):

    notification <the notification id of row <size>>
    previous <hex SHA-256 of the whole file of the checkpoint before it in the directory>
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from aggregates.decisions import Frozen
from aggregates.log_chain import GENESIS, leaf, next_link
from loop_actors._errors import UsageError
from loop_actors.store.store import EventStore

PREVIOUS = "previous"
"""The extension line naming the hash of the checkpoint before this one."""
NOTIFICATION = "notification"
"""The extension line giving the notification id of row ``size``."""

SIGNATURE_PREFIX = "\u2014 "
"""A signature line starts with an em dash and a space."""
ED25519 = b"\x01"


class CheckpointError(UsageError):
    """Raised when a checkpoint or key file is missing, malformed or of another kind."""


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: PLC0415
    except ImportError as error:  # pragma: no cover - a dependency of loop-actors
        raise CheckpointError(
            f"signing needs the cryptography package: {error} (pip install cryptography)"
        ) from error
    return ed25519


def key_id(name: str, public_key: bytes) -> bytes:
    """The 4-byte key id of an Ed25519 verifier key (C2SP signed-note)."""
    return hashlib.sha256(name.encode() + b"\n" + ED25519 + public_key).digest()[:4]


def _check_name(name: str) -> str:
    if not name or any(c in name for c in "+ \n\t") or not name.isprintable():
        raise CheckpointError(f"key name {name!r}: printable, without spaces or '+'")
    return name


@dataclass(frozen=True)
class SigningKey:
    """A private Ed25519 key with its name."""

    name: str
    seed: bytes

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte public key."""
        ed25519 = _crypto()
        private = ed25519.Ed25519PrivateKey.from_private_bytes(self.seed)
        raw: bytes = private.public_key().public_bytes_raw()
        return raw

    def sign(self, message: bytes) -> bytes:
        """The Ed25519 signature of ``message``."""
        ed25519 = _crypto()
        signature: bytes = ed25519.Ed25519PrivateKey.from_private_bytes(self.seed).sign(message)
        return signature

    def encoded(self) -> str:
        """The private key file's text (Go note's skey format)."""
        kid = key_id(self.name, self.public_key).hex()
        seed = base64.b64encode(ED25519 + self.seed).decode()
        return f"PRIVATE+KEY+{self.name}+{kid}+{seed}\n"

    def verifier(self) -> VerifierKey:
        """The matching verifier key."""
        return VerifierKey(self.name, self.public_key)


@dataclass(frozen=True)
class VerifierKey:
    """A public Ed25519 key with its name."""

    name: str
    public_key: bytes

    def encoded(self) -> str:
        """The verifier key file's text (Go note's vkey format)."""
        kid = key_id(self.name, self.public_key).hex()
        return f"{self.name}+{kid}+{base64.b64encode(ED25519 + self.public_key).decode()}\n"

    def verifies(self, message: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is this key's Ed25519 signature of ``message``."""
        ed25519 = _crypto()
        from cryptography.exceptions import InvalidSignature  # noqa: PLC0415

        try:
            ed25519.Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature, message)
        except InvalidSignature:
            return False
        return True


def generate_key(name: str) -> SigningKey:
    """A new random Ed25519 key."""
    return SigningKey(_check_name(name), os.urandom(32))


def _split_key(text: str, parts: int, path: Path) -> list[str]:
    fields = text.strip().split("+", parts - 1)
    if len(fields) != parts:
        raise CheckpointError(f"{path} is not a key file of this kind")
    return fields


def _decode_key_bytes(encoded: str, path: Path) -> bytes:
    try:
        raw = base64.b64decode(encoded, validate=True)
    except ValueError as error:
        raise CheckpointError(f"{path}: the key is not base64: {error}") from error
    if len(raw) != 33 or raw[:1] != ED25519:
        raise CheckpointError(f"{path}: not an Ed25519 key")
    return raw[1:]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CheckpointError(f"cannot read {path}: {error}") from error


def load_signing_key(path: Path) -> SigningKey:
    """Read a private key file (``audit keygen``).

    Raises:
        CheckpointError: unreadable, or not a private Ed25519 key, or its id is wrong.
    """
    fields = _split_key(_read(path), 5, path)
    if fields[:2] != ["PRIVATE", "KEY"]:
        raise CheckpointError(f"{path} is not a private key file (a .pub file is the public one)")
    key = SigningKey(_check_name(fields[2]), _decode_key_bytes(fields[4], path))
    if key_id(key.name, key.public_key).hex() != fields[3]:
        raise CheckpointError(f"{path}: its key id does not match the key")
    return key


def load_verifier_key(path: Path) -> VerifierKey:
    """Read a verifier key file (``KEYFILE.pub``).

    Raises:
        CheckpointError: unreadable, not a verifier key, or its id is wrong.
    """
    text = _read(path)
    if text.startswith("PRIVATE+KEY+"):
        raise CheckpointError(f"{path} is a private key: give its .pub file")
    fields = _split_key(text, 3, path)
    key = VerifierKey(_check_name(fields[0]), _decode_key_bytes(fields[2], path))
    if key_id(key.name, key.public_key).hex() != fields[1]:
        raise CheckpointError(f"{path}: its key id does not match the key")
    return key


def log_links(rows: Iterable[tuple[int, str, int, str, bytes]]) -> Iterable[tuple[int, str]]:
    """(notification id, link) for each stored row, in order."""
    link = GENESIS
    for notification_id, originator_id, version, topic, state in rows:
        link = next_link(link, leaf(notification_id, originator_id, version, topic, state))
        yield notification_id, link


def log_head(store: EventStore) -> tuple[int, str]:
    """The size of the store's log (its rows) and its head link (GENESIS when empty)."""
    size, head = 0, GENESIS
    for _, link in log_links(store.log_rows()):
        size += 1
        head = link
    return size, head


@dataclass(frozen=True)
class Checkpoint:
    """A parsed checkpoint note."""

    origin: str
    size: int
    head: str
    text: bytes
    """The signed text (the note up to the blank line)."""
    signatures: list[tuple[str, bytes, bytes]]
    """(key name, key id, signature) of each signature line."""
    extensions: tuple[str, ...] = ()
    """The note's extension lines (after the head), in order."""

    def extension(self, name: str) -> str | None:
        """The value of the first ``name <value>`` extension line, or None."""
        for line in self.extensions:
            key, _, value = line.partition(" ")
            if key == name:
                return value
        return None

    @property
    def previous(self) -> str | None:
        """The hex SHA-256 of the checkpoint file before this one (a directory's chain)."""
        return self.extension(PREVIOUS)

    @property
    def notification_id(self) -> int | None:
        """The notification id of the log's row ``size`` (None when the note does not say)."""
        value = self.extension(NOTIFICATION)
        return int(value) if value is not None and value.isdigit() else None


def checkpoint_note(
    origin: str,
    size: int,
    head: str,
    key: SigningKey | None,
    *,
    extensions: Sequence[str] = (),
) -> str:
    """The checkpoint's note text, with extension lines, signed with ``key`` when given."""
    text = f"{origin}\n{size}\n{base64.b64encode(bytes.fromhex(head)).decode()}\n"
    text += "".join(f"{line}\n" for line in extensions)
    if key is None:
        return text
    signature = key_id(key.name, key.public_key) + key.sign(text.encode())
    return f"{text}\n{SIGNATURE_PREFIX}{key.name} {base64.b64encode(signature).decode()}\n"


def parse_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint note.

    Raises:
        CheckpointError: unreadable or not a checkpoint note.
    """
    return parse_note(_read(path), path)


def parse_note(note: str, path: Path | str) -> Checkpoint:
    """Parse a checkpoint note's text (``path`` names it in errors).

    Raises:
        CheckpointError: not a checkpoint note.
    """
    if "\n\n" in note:
        first, signed = note.split("\n\n", 1)
        body = first + "\n"
    else:
        body, signed = note, ""
    lines = body[:-1].split("\n")
    if not body.endswith("\n") or len(lines) < 3:
        raise CheckpointError(f"{path} is not a checkpoint note (origin, size, head)")
    origin, size_text, root = lines[0], lines[1], lines[2]
    if not size_text.isdigit():
        raise CheckpointError(f"{path}: the size {size_text!r} is not a number")
    try:
        head = base64.b64decode(root, validate=True)
    except ValueError as error:
        raise CheckpointError(f"{path}: the head is not base64: {error}") from error
    if len(head) != 32:
        raise CheckpointError(f"{path}: the head is not 32 bytes")
    signatures: list[tuple[str, bytes, bytes]] = []
    for line in signed.splitlines():
        if not line.startswith(SIGNATURE_PREFIX) or line.count(" ") != 2:
            raise CheckpointError(f"{path}: {line!r} is not a signature line")
        name, encoded = line[len(SIGNATURE_PREFIX) :].split(" ")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except ValueError as error:
            raise CheckpointError(f"{path}: a signature is not base64: {error}") from error
        if len(raw) < 5:
            raise CheckpointError(f"{path}: a signature is too short")
        signatures.append((name, raw[:4], raw[4:]))
    if any(not line for line in lines[3:]):
        raise CheckpointError(f"{path}: an empty extension line")
    return Checkpoint(
        origin=origin,
        size=int(size_text),
        head=head.hex(),
        text=body.encode(),
        signatures=signatures,
        extensions=tuple(lines[3:]),
    )


class Verdict(StrEnum):
    """What the log, a checkpoint or a checkpoint directory was found to be."""

    OK = "ok"
    TRUNCATED = "truncated"
    """The log has fewer rows than a commitment's size."""
    FORKED = "forked"
    """Exactly as many rows as committed to, another head."""
    ANOTHER_STORE = "another_store"
    """The checkpoint is of another store: its origin names another store's identity."""
    EDITED = "edited"
    """More rows than committed to, and the first ``size`` do not give the head."""
    GAP = "gap"
    """A notification id is missing from the log (rows deleted from its middle)."""
    REORDERED = "reordered"
    """An aggregate's event is stored after a later event of the same aggregate."""
    BAD_SIGNATURE = "bad_signature"
    UNSIGNED = "unsigned"
    CHECKPOINT_MISSING = "checkpoint_missing"
    """A checkpoint of a directory's chain is gone (removed, or the chain rolled back)."""
    CHECKPOINT_EDITED = "checkpoint_edited"
    """A checkpoint file of a directory is not the one its successor (or the last verify) named."""


class CheckpointReport(Frozen):
    """One finding (or the ``ok``) of the log, of a commitment against it, or of a directory.

    ``kind`` says what it is about: ``log`` (the log itself: ``gap``, ``reordered``,
    or one ``ok``), ``checkpoint`` (a checkpoint note, or the last verified state,
    against the log) or ``checkpoint_chain`` (a directory's chain of checkpoints).
    """

    kind: str = "checkpoint"
    verdict: Verdict
    source: str | None = None
    """The checkpoint file, the directory, ``log`` or the last-verified state file."""
    signed: str | None = None
    """``verified`` (by --key), ``not checked`` (no --key), ``unsigned``, ``bad``, or
    ``local`` for the last-verified state; None for the log's own findings."""
    size: int | None = None
    """The commitment's size (the log's for ``kind`` ``log``)."""
    store_size: int
    """The store's rows now."""
    head: str | None = None
    position: int | None = None
    """``gap``: the first missing notification id; ``reordered``: the notification id of the
    row out of order; ``edited``/``forked``: the first row that may differ (one after the
    largest commitment the log still gives); ``checkpoint_*``: the checkpoint's number."""
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return self.verdict is Verdict.OK


@dataclass(frozen=True)
class Commitment:
    """A size and head the log must still give: a checkpoint's, or the last verify's."""

    source: str
    origin: str
    size: int
    head: str
    signed: str


@dataclass(frozen=True)
class LogHead:
    """The log as read by a verify: its size, head and last notification id."""

    size: int
    head: str
    last_id: int


def check_signature(
    checkpoint: Checkpoint, key: VerifierKey | None, source: str
) -> tuple[str, CheckpointReport | None]:
    """The ``signed`` state of a checkpoint, and the finding when ``key`` does not verify it."""
    if key is None:
        return ("unsigned" if not checkpoint.signatures else "not checked"), None
    if not checkpoint.signatures:
        return "unsigned", CheckpointReport(
            verdict=Verdict.UNSIGNED,
            source=source,
            signed="unsigned",
            size=checkpoint.size,
            store_size=0,
            head=checkpoint.head,
            problem="the checkpoint has no signature",
        )
    expected = key_id(key.name, key.public_key)
    if any(
        name == key.name and kid == expected and key.verifies(checkpoint.text, sig)
        for name, kid, sig in checkpoint.signatures
    ):
        return "verified", None
    return "bad", CheckpointReport(
        verdict=Verdict.BAD_SIGNATURE,
        source=source,
        signed="bad",
        size=checkpoint.size,
        store_size=0,
        head=checkpoint.head,
        problem=f"no valid signature by {key.name} (the note was changed, or another key "
        "signed it)",
    )


def verify_log(
    store: EventStore, commitments: Sequence[Commitment]
) -> tuple[list[CheckpointReport], LogHead]:
    """Read the whole log once: its own findings, then one report per commitment.

    The log's findings: ``gap`` for each run of missing notification ids (only on a
    store whose ids have no gaps by construction: SQLite's row ids), ``reordered``
    for each row stored after a later event of its aggregate. Each commitment is
    then ``ok``, ``truncated``, ``forked``, ``edited`` or ``another_store``.
    """
    wanted = {commitment.size for commitment in commitments}
    links: dict[int, str] = {0: GENESIS}
    findings: list[CheckpointReport] = []
    size, link, previous_id = 0, GENESIS, 0
    versions: dict[str, int] = {}
    dense = store.contiguous_ids
    for notification_id, originator_id, version, topic, state in store.log_rows():
        size += 1
        if dense and notification_id != previous_id + 1:
            missing = notification_id - previous_id - 1
            findings.append(
                _log_finding(
                    Verdict.GAP,
                    previous_id + 1,
                    f"notification {previous_id + 1}"
                    + (f" and the {missing - 1} after it are" if missing > 1 else " is")
                    + " missing: rows were deleted from the middle of the log",
                )
            )
        seen = versions.get(originator_id)
        if seen is not None and version < seen:
            findings.append(
                _log_finding(
                    Verdict.REORDERED,
                    notification_id,
                    f"row {notification_id} is event {version} of {originator_id}, stored "
                    f"after its event {seen}: rows were swapped or moved",
                )
            )
        versions[originator_id] = max(version, seen or 0)
        link = next_link(link, leaf(notification_id, originator_id, version, topic, state))
        if size in wanted:
            links[size] = link
        previous_id = notification_id
    store_size = size
    expected_origin = f"loop-actors/{store.store_id}"
    good_sizes = sorted(
        c.size for c in commitments if c.origin == expected_origin and links.get(c.size) == c.head
    )
    reports = [
        finding.model_copy(update={"store_size": store_size, "size": store_size})
        for finding in findings
    ]
    for commitment in commitments:
        reports.append(_against(commitment, links, store_size, expected_origin, good_sizes))
    return reports, LogHead(store_size, link, previous_id)


def _log_finding(verdict: Verdict, position: int, problem: str) -> CheckpointReport:
    return CheckpointReport(
        kind="log", verdict=verdict, source="log", store_size=0, position=position, problem=problem
    )


def _against(
    commitment: Commitment,
    links: dict[int, str],
    store_size: int,
    expected_origin: str,
    good_sizes: list[int],
) -> CheckpointReport:
    report = CheckpointReport(
        verdict=Verdict.OK,
        source=commitment.source,
        signed=commitment.signed,
        size=commitment.size,
        store_size=store_size,
        head=commitment.head,
    )
    if commitment.origin != expected_origin:
        return report.model_copy(
            update={
                "verdict": Verdict.ANOTHER_STORE,
                "problem": f"it is of {commitment.origin}, this store is {expected_origin}",
            }
        )
    if store_size < commitment.size:
        return report.model_copy(
            update={
                "verdict": Verdict.TRUNCATED,
                "position": store_size + 1,
                "problem": f"the store has {store_size} rows, the checkpoint commits to "
                f"{commitment.size}",
            }
        )
    if links[commitment.size] != commitment.head:
        below = [size for size in good_sizes if size < commitment.size]
        after = below[-1] if below else 0
        return report.model_copy(
            update={
                "verdict": Verdict.FORKED if store_size == commitment.size else Verdict.EDITED,
                "position": after + 1,
                "problem": f"the first {commitment.size} rows do not give its head: a row "
                f"from {after + 1} to {commitment.size} was changed, replaced, reordered or "
                "deleted and another appended",
            }
        )
    return report
