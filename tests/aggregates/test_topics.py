"""The persisted topics are a contract: every stored class name resolves, and none changes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from eventsourcing.utils import get_topic, resolve_topic

from aggregates.audit import unpack_state
from aggregates.audit_coverage import KINDS, event_classes
from aggregates.invocation import InvocationSnapshot
from aggregates.topics import PERSISTED_TOPICS

FIXTURES = Path(__file__).parents[1] / "fixtures"

# Literal on purpose: a topic string written here never changes (stores and chain hashes
# hold it). A new class appends a line; editing or deleting one breaks every old store.
FROZEN = [
    "aggregates.invocation:Invocation",
    "aggregates.effect:Effect",
    "aggregates.requests:CancelRequest",
    "aggregates.invocation:InvocationStarted",
    "aggregates.invocation:SettingsChanged",
    "aggregates.invocation:DecisionProposed",
    "aggregates.invocation:BatchDispatched",
    "aggregates.invocation:ResultsCommitted",
    "aggregates.invocation:BudgetReserved",
    "aggregates.invocation:BudgetReturned",
    "aggregates.invocation:Paused",
    "aggregates.invocation:ApprovalGranted",
    "aggregates.invocation:ApprovalDenied",
    "aggregates.invocation:ClarificationProvided",
    "aggregates.invocation:VerificationFailed",
    "aggregates.invocation:ContextCompacted",
    "aggregates.invocation:LeaseAcquired",
    "aggregates.invocation:Terminated",
    "aggregates.invocation:InvocationSnapshot",
    "aggregates.effect:EffectPrepared",
    "aggregates.effect:EffectDispatched",
    "aggregates.effect:EffectCommitted",
    "aggregates.effect:EffectRejected",
    "aggregates.effect:EffectOutcomeUnknown",
    "aggregates.effect:EffectReconciled",
    "aggregates.effect:EffectResolvedByHand",
    "aggregates.requests:CancelRequested",
    "aggregates.invocation:SleepEnded",
    "aggregates.invocation:PlanProposed",
    "aggregates.invocation:CritiqueReturned",
]

_ROW = re.compile(r"VALUES\('[^']*',\d+,'([^']*)',X'([0-9A-Fa-f]*)'\)")


def _fixture_topics() -> set[str]:
    """Every topic the fixture stores hold: row topics, and the class topics in their states."""
    found: set[str] = set()
    for path in sorted(FIXTURES.glob("*.sql")):
        for match in _ROW.finditer(path.read_text()):
            found.add(match.group(1))
            state = json.loads(unpack_state(bytes.fromhex(match.group(2))))  # packed: 0.1.0
            for name in ("originator_topic", "topic"):  # an aggregate's class; a snapshot's
                if isinstance(state.get(name), str):
                    found.add(state[name])
    return found


def test_the_persisted_topics_are_exactly_the_frozen_literal_list() -> None:
    assert list(PERSISTED_TOPICS) == FROZEN


def test_every_topic_in_the_fixture_stores_is_persisted_and_resolves_to_its_class() -> None:
    found = _fixture_topics()
    assert len(found) >= 20  # the parse found the rows (17 event topics, 3 aggregate classes)
    assert found <= set(PERSISTED_TOPICS)
    for topic in found:
        assert resolve_topic(topic) is PERSISTED_TOPICS[topic]


def test_every_event_aggregate_and_snapshot_class_writes_its_registered_topic() -> None:
    classes = [*event_classes(), *(kind.aggregate for kind in KINDS), InvocationSnapshot]
    assert {get_topic(cls) for cls in classes} == set(PERSISTED_TOPICS)
    for cls in classes:
        topic = get_topic(cls)
        assert PERSISTED_TOPICS[topic] is cls
        assert resolve_topic(topic) is cls
