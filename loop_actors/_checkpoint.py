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
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aggregates.decisions import Frozen
from aggregates.log_chain import GENESIS, leaf, next_link
from loop_actors._errors import UsageError
from loop_actors._store import EventStore

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


def checkpoint_note(origin: str, size: int, head: str, key: SigningKey | None) -> str:
    """The checkpoint's note text, signed with ``key`` when given."""
    text = f"{origin}\n{size}\n{base64.b64encode(bytes.fromhex(head)).decode()}\n"
    if key is None:
        return text
    signature = key_id(key.name, key.public_key) + key.sign(text.encode())
    return f"{text}\n{SIGNATURE_PREFIX}{key.name} {base64.b64encode(signature).decode()}\n"


def parse_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint note.

    Raises:
        CheckpointError: unreadable or not a checkpoint note.
    """
    note = _read(path)
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
    return Checkpoint(
        origin=origin,
        size=int(size_text),
        head=head.hex(),
        text=body.encode(),
        signatures=signatures,
    )


class CheckpointReport(Frozen):
    """The verdict of a store against a checkpoint."""

    kind: str = "checkpoint"
    verdict: str
    """``ok``, ``truncated``, ``forked``, ``edited``, ``gap``, ``bad_signature`` or ``unsigned``."""
    signed: str
    """``verified`` (by --key), ``not checked`` (no --key) or ``unsigned``."""
    size: int
    """The checkpoint's size."""
    store_size: int
    """The store's rows now."""
    head: str
    position: int | None = None
    """For ``gap``: the first missing notification id."""
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return self.verdict == "ok"


def verify_against(
    store: EventStore, checkpoint: Checkpoint, key: VerifierKey | None
) -> CheckpointReport:
    """Check the store's log against a checkpoint (and its signature, with ``key``)."""
    signed = "unsigned" if not checkpoint.signatures else "not checked"
    if key is not None:
        mine = [s for s in checkpoint.signatures if s[0] == key.name]
        if not checkpoint.signatures:
            return _report("unsigned", "unsigned", checkpoint, 0, "the checkpoint has no signature")
        expected = key_id(key.name, key.public_key)
        if not any(kid == expected and key.verifies(checkpoint.text, sig) for _, kid, sig in mine):
            return _report(
                "bad_signature",
                "bad",
                checkpoint,
                0,
                f"no valid signature by {key.name} (the note was changed, or another key "
                "signed it)",
            )
        signed = "verified"
    expected_origin = f"loop-actors/{store.store_id}"
    size, link, previous_id = 0, GENESIS, 0
    at_size: str | None = GENESIS if checkpoint.size == 0 else None
    gap: int | None = None
    for notification_id, current in log_links(store.log_rows()):
        size += 1
        if (
            gap is None
            and store.contiguous_ids
            and size <= checkpoint.size
            and notification_id != previous_id + 1
        ):
            gap = previous_id + 1
        previous_id = notification_id
        link = current
        if size == checkpoint.size:
            at_size = link
    if checkpoint.origin != expected_origin:
        return _report(
            "forked",
            signed,
            checkpoint,
            size,
            f"the checkpoint is of {checkpoint.origin}, this store is {expected_origin}",
        )
    if gap is not None:
        return _report(
            "gap",
            signed,
            checkpoint,
            size,
            f"notification {gap} is missing: rows were deleted from the middle of the log",
            position=gap,
        )
    if size < checkpoint.size:
        return _report(
            "truncated",
            signed,
            checkpoint,
            size,
            f"the store has {size} rows, the checkpoint commits to {checkpoint.size}",
        )
    if at_size != checkpoint.head:
        verdict = "forked" if size == checkpoint.size else "edited"
        return _report(
            verdict,
            signed,
            checkpoint,
            size,
            f"the first {checkpoint.size} rows do not give the checkpoint's head "
            "(a row was changed, replaced, reordered or deleted and another appended)",
        )
    return _report("ok", signed, checkpoint, size, None)


def _report(
    verdict: str,
    signed: str,
    checkpoint: Checkpoint,
    store_size: int,
    problem: str | None,
    *,
    position: int | None = None,
) -> CheckpointReport:
    return CheckpointReport(
        verdict=verdict,
        signed=signed,
        size=checkpoint.size,
        store_size=store_size,
        head=checkpoint.head,
        position=position,
        problem=problem,
    )
