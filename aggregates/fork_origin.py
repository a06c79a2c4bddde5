"""Where a fork came from, as its ``InvocationStarted`` records it (``forked_from``).

The values only (the rules are in :mod:`aggregates.fork`): the events import them.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import JsonValue

from aggregates.decisions import EffectStatus, Frozen


class ForkWrites(StrEnum):
    """What a fork's write does that repeats a write its source committed after the fork point."""

    APPROVE = "approve"
    """It waits for a person (``approval_required``), shown the source's step, key and receipt."""
    DENY = "deny"
    """It is refused, with a result the model sees."""
    LIVE = "live"
    """It runs as a new write, under the fork's own effect key."""
    DEDUPE = "dedupe"
    """It reuses the source's effect key and receipt: the ledger answers ``committed``."""


class SourceWrite(Frozen):
    """A write the source committed after the fork point, as the fork's origin records it."""

    step: int
    call_id: str
    tool: str
    arguments_digest: str
    """``digest_of`` the call's arguments as dispatched (normalised, redacted)."""
    effect_key: str
    status: EffectStatus
    """``committed``, or ``reconciled`` (its service or a person said it happened)."""
    receipt: JsonValue = None
    """The receipt the ledger holds (as its tool redacts it)."""


class ForkOrigin(Frozen):
    """Where a fork came from: recorded in its ``InvocationStarted`` (``forked_from``)."""

    source_id: str
    at_step: int
    """The last step copied from the source (0: none)."""
    source_version: int
    """The version of the source's last event when it was forked."""
    source_head_hash: str
    """The chain hash of that event: the source's history the fork was made from."""
    by: str
    reason: str
    writes: ForkWrites = ForkWrites.APPROVE
    source_agent_name: str
    source_catalogue_digest: str
    changed: list[str] = []
    """What the fork's start differs in from the source's: ``agent_name``,
    ``agent_version``, ``catalogue``, ``budget.<field>``, ``settings.<field>``."""
    source_writes: list[SourceWrite] = []
    """The writes the source committed after ``at_step``, oldest first."""
