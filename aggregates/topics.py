"""The persisted topics: every class name a store holds, frozen as a contract.

A stored event row names its class by topic (``module:qualname``), an aggregate's
first event names the aggregate's class (``originator_topic``), and a snapshot row
names the snapshot class. Those strings are in every store ever written, and the
audit chain hashes the topic of each event: they never change. This module lists
them, one literal each, and registers each with eventsourcing
(:func:`eventsourcing.utils.register_topic`) when ``aggregates`` is imported, so
a class that moves to another module still resolves from its old topic. A class
that moves also carries ``TOPIC = "<its old topic>"`` (eventsourcing's
``construct_topic`` reads it), so that events written after the move keep the
same topic string, and the same chain hashes.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from eventsourcing.utils import register_topic

from aggregates.effect import (
    Effect,
    EffectCommitted,
    EffectDispatched,
    EffectOutcomeUnknown,
    EffectPrepared,
    EffectReconciled,
    EffectRejected,
    EffectResolvedByHand,
)
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    BudgetReserved,
    BudgetReturned,
    ClarificationProvided,
    ContextCompacted,
    CritiqueReturned,
    DecisionProposed,
    Invocation,
    InvocationSnapshot,
    InvocationStarted,
    LeaseAcquired,
    Paused,
    PlanProposed,
    ResultsCommitted,
    SettingsChanged,
    SleepEnded,
    Terminated,
    VerificationFailed,
)
from aggregates.requests import CancelRequest, CancelRequested

PERSISTED_TOPICS: Mapping[str, type] = MappingProxyType(
    {
        # Aggregate classes (an aggregate's first event's ``originator_topic``).
        "aggregates.invocation:Invocation": Invocation,
        "aggregates.effect:Effect": Effect,
        "aggregates.requests:CancelRequest": CancelRequest,
        # Invocation events.
        "aggregates.invocation:InvocationStarted": InvocationStarted,
        "aggregates.invocation:SettingsChanged": SettingsChanged,
        "aggregates.invocation:DecisionProposed": DecisionProposed,
        "aggregates.invocation:BatchDispatched": BatchDispatched,
        "aggregates.invocation:ResultsCommitted": ResultsCommitted,
        "aggregates.invocation:BudgetReserved": BudgetReserved,
        "aggregates.invocation:BudgetReturned": BudgetReturned,
        "aggregates.invocation:Paused": Paused,
        "aggregates.invocation:ApprovalGranted": ApprovalGranted,
        "aggregates.invocation:ApprovalDenied": ApprovalDenied,
        "aggregates.invocation:ClarificationProvided": ClarificationProvided,
        "aggregates.invocation:VerificationFailed": VerificationFailed,
        "aggregates.invocation:ContextCompacted": ContextCompacted,
        "aggregates.invocation:LeaseAcquired": LeaseAcquired,
        "aggregates.invocation:Terminated": Terminated,
        # Invocation snapshots (the snapshot rows' topic).
        "aggregates.invocation:InvocationSnapshot": InvocationSnapshot,
        # Effect ledger events.
        "aggregates.effect:EffectPrepared": EffectPrepared,
        "aggregates.effect:EffectDispatched": EffectDispatched,
        "aggregates.effect:EffectCommitted": EffectCommitted,
        "aggregates.effect:EffectRejected": EffectRejected,
        "aggregates.effect:EffectOutcomeUnknown": EffectOutcomeUnknown,
        "aggregates.effect:EffectReconciled": EffectReconciled,
        "aggregates.effect:EffectResolvedByHand": EffectResolvedByHand,
        # Cancel requests.
        "aggregates.requests:CancelRequested": CancelRequested,
        # Added later (appended: the list is frozen).
        "aggregates.invocation:SleepEnded": SleepEnded,
        "aggregates.invocation:PlanProposed": PlanProposed,
        "aggregates.invocation:CritiqueReturned": CritiqueReturned,
    }
)
"""Every topic a store may hold, and the class it names (frozen: append, never edit)."""


def register_persisted_topics() -> None:
    """Register every persisted topic with eventsourcing (idempotent)."""
    for topic, cls in PERSISTED_TOPICS.items():
        register_topic(topic, cls)


register_persisted_topics()
