"""Verify an exported history without loop-actors: the hashing needs only json and hashlib.

    loop-actors history ID --json > export.jsonl
    python verify_export.py export.jsonl [--head HASH]
    loop-actors history ID --json | python verify_export.py

Each line is one event: its record (data, id, position, timestamp, type), its hash
and the hash before it. An event of audit format 2 (``"format": 2``) also carries its
topic and its body exactly as stored (``stored``), which is what its hash covers; an
event of format 1, the canonical form of its record. The chain is recomputed from the
records alone, and
the first position that does not match is named. With --head, the chain must also
pass through a head hash anchored elsewhere earlier (the last hash of the history as
it was then): that catches a history rewritten whole, or its last events cut off.

Exit status: 0 intact, 1 broken, 2 bad usage or a line that is not a record.
"""

import argparse
import hashlib
import json
import sys
from collections.abc import Iterable
from typing import Any

GENESIS = "0" * 64  # the hash before an aggregate's first event
CANONICAL_KEYS = ("data", "id", "position", "timestamp", "type")


def canonical_bytes(record: dict[str, Any]) -> bytes:
    """What was hashed: the five canonical keys, sorted, without spaces, in UTF-8."""
    canonical = {key: record[key] for key in CANONICAL_KEYS}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def chain_hash(previous_hash: str, record: dict[str, Any]) -> str:
    """The hash the record must carry after ``previous_hash``, in its audit format.

    Format 2: SHA-256 of the previous hash, a newline, the header (the JSON array of id,
    position and topic), a newline, and the stored body. Format 1: SHA-256 of the previous
    hash, a newline, and the canonical bytes.
    """
    if record.get("format") == 2:
        header = json.dumps(
            [record["id"], record["position"], record["topic"]],
            separators=(",", ":"),
            ensure_ascii=True,
        )
        hashed = header.encode() + b"\n" + record["stored"].encode("utf-8")
        return hashlib.sha256(previous_hash.encode() + b"\n" + hashed).hexdigest()
    return hashlib.sha256(previous_hash.encode() + b"\n" + canonical_bytes(record)).hexdigest()


def stored_data(record: dict[str, Any]) -> tuple[Any, Any]:
    """Format 2: the data and timestamp the stored body holds (the record must show them)."""
    body = json.loads(record["stored"])
    envelope = {"timestamp", "originator_topic", "audit_format"}
    return {k: v for k, v in body.items() if k not in envelope}, body.get("timestamp")


def first_break(records: list[dict[str, Any]]) -> tuple[int, str] | None:
    """The first position where the chain breaks, and why; None when it is whole."""
    previous = GENESIS
    for expected, record in enumerate(records, start=1):
        if record["id"] != records[0]["id"]:
            return expected, f"the record belongs to {record['id']}"
        if record["position"] != expected:
            return expected, f"found position {record['position']} instead"
        if record.get("previous_hash", previous) != previous:
            return expected, "its previous_hash is not the hash of the event before it"
        if record.get("hash") != chain_hash(previous, record):
            return expected, "its hash does not match its content and the previous hash"
        if record.get("format") == 2 and stored_data(record) != (
            record["data"],
            record["timestamp"],
        ):
            return expected, "its data is not what its stored body holds"
        previous = record["hash"]
    return None


def read_records(lines: Iterable[str]) -> list[dict[str, Any]]:
    """One JSON record a line (blank lines skipped)."""
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not isinstance(record, dict) or not set(CANONICAL_KEYS) <= set(record):
            raise ValueError(f"line {number} is not a history record")
        records.append(record)
    if not records:
        raise ValueError("no records")
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description="Verify a `loop-actors history --json` export.")
    parser.add_argument("export", nargs="?", help="the export file (default: standard input)")
    parser.add_argument("--head", help="a head hash anchored elsewhere earlier")
    args = parser.parse_args()
    try:
        if args.export is None:
            records = read_records(sys.stdin)
        else:
            with open(args.export, encoding="utf-8") as export:
                records = read_records(export)
    except (OSError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        print(f"verify_export: {error}", file=sys.stderr)
        return 2

    name = records[0]["id"]
    broken = first_break(records)
    if broken is not None:
        position, problem = broken
        print(f"BROKEN {name} at position {position}: {problem}")
        return 1
    head = records[-1]["hash"]
    if args.head is not None:
        # A whole chain that passes through the anchored hash starts with exactly the
        # events that were anchored; any events after it were appended since.
        anchored = [record["position"] for record in records if record["hash"] == args.head]
        if not anchored:
            print(f"BROKEN {name}: the anchored head {args.head} is not in this history")
            return 1
        print(f"OK {name}: {len(records)} events, head {head}, anchored at {anchored[0]}")
    else:
        print(f"OK {name}: {len(records)} events, head {head}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
