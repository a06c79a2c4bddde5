"""No secret reaches a database file, whatever path it takes: the scenarios of issue 12.

Each scenario runs an agent whose tools declare a sensitive argument (``card_number``,
value :data:`CARD`) and a sensitive output field (``token``, value :data:`TOKEN`),
then builds the read models and greps the raw bytes of every file next to the store
(the event store, its ``-wal`` and ``-shm``, the ``.views.db`` and its ``-wal`` /
``-shm``) for both values: before the files are closed (WAL still present) and after.
Every scenario runs twice: on a plain store and with eventsourcing's AES cipher
(``CIPHER_TOPIC=eventsourcing.cipher:AESCipher``), whose read models are not encrypted.
Each scenario also checks that its path was taken (a rejection, a scrubbed message, a
dropped part, a reconciled receipt), so that none passes by not reaching the secret.

The inputs tried:

1. arguments sent as JSON text (the OpenAI adapter's path) with the card, rejected
   (another argument has the wrong type);
2. a call with a misspelled tool name (``tokenise``) carrying the card;
3. the whole proposal as JSON text, rejected, holding the card;
4. ``calls`` that is an object, not a list, holding the card;
5. a read tool raising ``ValueError`` that quotes the card;
6. a read tool raising ``ToolError`` that quotes the card;
7. a write raising ``ConnectionError`` that quotes the card: ``outcome_unknown``, the
   ledger's ``EffectOutcomeUnknown.reason``, a pause for reconciliation;
8. a write whose process is SIGKILLed after the service committed; ``resume`` in a new
   process reconciles it and the service's receipt holds the token;
9. the same receipt settled by the sweeper (``Runtime.reconcile``) after the invocation
   was cancelled while paused for reconciliation;
10. a tool output whose ``token`` field is sensitive;
11. a dispatched call with the card as its sensitive argument;
12. a rejected proposal of a known tool with the card under its declared name, and
    again under a misspelled argument name (``card_numbr``);
13. a tool whose argument validator quotes the card in its error (a rejection's
    problems and the ``invalid_decision`` detail);
14. a write rejected on resume by its service with a reason quoting the card;
15. the sweeper settling a rejection whose reason quotes the card, after the
    invocation's secrets were deleted (the reason is withheld: digest and size);
16. a call paused for approval, approved and resumed by another ``Runtime`` (with the
    cipher its sealed secret store gives the card back and the tool's ``ValueError``
    quoting it is scrubbed; without, the call does not run).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
import trio
from pydantic import AfterValidator

from aggregates.decisions import EffectStatus
from aggregates.invocation import DecisionProposed, ResultsCommitted, Terminated
from loop_actors import (
    Agent,
    ErrorClass,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolError,
    tool,
)
from loop_actors.store.read_models import open_runner
from loop_actors.store.store import EventStore

CARD = "4111111111111111"
TOKEN = "tok_live_9f8e7d6c5b4a"
SECRETS = (CARD.encode(), TOKEN.encode())


# --------------------------------------------------------------------------- tools


@tool(sensitive_arguments=["card_number"], sensitive_output=["token"])
def tokenize(card_number: str, holder: str) -> dict[str, Any]:
    """Turn a card into a token."""
    return {"token": TOKEN, "last4": card_number[-4:], "holder": holder}


@tool(sensitive_arguments=["card_number"])
def check_card(card_number: str) -> str:
    """Check a card (it always fails, quoting the card)."""
    raise ValueError(f"card {card_number} has expired")


@tool(sensitive_arguments=["card_number"])
def verify_card(card_number: str) -> str:
    """Verify a card (it always refuses, quoting the card)."""
    raise ToolError(f"card {card_number} is on a block list", error_class=ErrorClass.DENIED)


@tool(sensitive_arguments=["card_number"], requires_approval=True)
def refund(card_number: str) -> str:
    """Refund a card, once approved (it fails, quoting the card)."""
    raise ValueError(f"card {card_number} cannot be refunded")


def _valid_card(value: str) -> str:
    if not value.startswith("5"):
        raise ValueError(f"{value} is not a card we accept")
    return value


@tool(sensitive_arguments=["card_number"])
def strict_card(card_number: Annotated[str, AfterValidator(_valid_card)]) -> str:
    """Accept only some cards (its validator quotes the value)."""
    return "ok"


class Service:
    """The payment service: what ``reconcile`` answers, switched by the test."""

    reachable = False
    resolution = "committed"


def _reconcile(key: str) -> Reconciled:
    if not Service.reachable:
        raise ConnectionError("the payment service is down")
    if Service.resolution == "committed":
        return Reconciled(status="committed", receipt={"token": TOKEN, "charge": key[:8]})
    return Reconciled(status="rejected", reason=f"card {CARD} was declined")


@tool(
    effect="write",
    reconcile=_reconcile,
    sensitive_arguments=["card_number"],
    sensitive_output=["token"],
)
def charge(card_number: str, amount: int) -> dict[str, Any]:
    """Charge a card (the connection drops, quoting the card)."""
    raise ConnectionError(f"connection reset while charging {card_number}")


@tool(
    effect="write",
    reconcile=_reconcile,
    sensitive_arguments=["card_number"],
    sensitive_output=["token"],
)
def pay(card_number: str, amount: int) -> dict[str, Any]:
    """Pay with a card; the service answers a token."""
    return {"token": TOKEN, "charge": "ch_1"}


TOOLS = [tokenize, check_card, verify_card, strict_card, charge, pay, refund]


def _calls(name: str, arguments: Any, call_id: str = "c") -> dict[str, Any]:
    return {"kind": "tool_calls", "calls": [{"id": call_id, "name": name, "arguments": arguments}]}


FINAL = {"kind": "final", "answer": "done"}


def agent(script: list[Any] | Callable[[ModelRequest], Any], **settings: Any) -> Agent:
    return Agent("payer", ScriptedModel(script), TOOLS, **settings)


# For scenario 8, run by the CLI from a copy of this file: pay with the card, then answer.
AGENT = agent([_calls("pay", {"card_number": CARD, "amount": 5}), FINAL])


# --------------------------------------------------------------------------- the checks


def files(folder: Path) -> Iterator[Path]:
    return (p for p in sorted(folder.iterdir()) if p.is_file() and ".db" in p.name)


def assert_no_secret(folder: Path) -> None:
    for path in files(folder):
        from tests.support.stored_bytes import readable_bytes  # this file is also an agent module

        data = readable_bytes([path])
        for secret in SECRETS:
            assert secret not in data, f"{secret.decode()} found in {path.name}"


def build_read_models_and_grep(folder: Path) -> None:
    """Grep the files as the run left them, with the read models open, and after closing."""
    url = f"sqlite:///{folder / 'events.db'}"
    assert_no_secret(folder)
    store = EventStore(url)
    runner = open_runner(store)
    try:
        runner.catch_up()
        assert (folder / "events.views.db").exists()
        assert_no_secret(folder)
    finally:
        runner.close()
        store.close()
    assert_no_secret(folder)


def history(folder: Path, invocation_id: str) -> list[Any]:
    store = EventStore(f"sqlite:///{folder / 'events.db'}")
    try:
        return list(store.events(invocation_id))
    finally:
        store.close()


def effect_events(folder: Path, invocation_id: str) -> list[Any]:
    """The ledger events of the invocation's writes, in order."""
    store = EventStore(f"sqlite:///{folder / 'events.db'}")
    try:
        keys = [
            call.effect_key
            for event in store.events(invocation_id)
            if type(event).__name__ == "BatchDispatched"
            for call in event.calls  # type: ignore[attr-defined]
            if call.effect_key is not None
        ]
        return [event for key in keys for _, event in store.stored_entries(key)]
    finally:
        store.close()


def effect_reasons(folder: Path, invocation_id: str) -> list[str | None]:
    return [getattr(event, "reason", None) for event in effect_events(folder, invocation_id)]


def rejection(events: list[Any]) -> Any:
    rejected = [e.rejection for e in events if isinstance(e, DecisionProposed) and e.rejection]
    assert rejected, "the proposal was not rejected"
    return rejected[0]


def error_messages(events: list[Any]) -> list[str]:
    return [
        r.error.message
        for e in events
        if isinstance(e, ResultsCommitted)
        for r in e.results
        if r.error is not None
    ]


def run(folder: Path, agent_: Agent, invocation_id: str = "s") -> Any:
    return Runtime(f"sqlite:///{folder / 'events.db'}").run_sync(
        agent_, "pay", invocation_id=invocation_id
    )


# --------------------------------------------------------------------------- scenarios


def s01_json_text_arguments_rejected(folder: Path) -> None:
    text = json.dumps({"card_number": CARD, "holder": 5})
    outcome = run(folder, agent([_calls("tokenize", text)], max_invalid_proposals=0))
    assert outcome.reason is TerminalReason.INVALID_DECISION
    raw = rejection(history(folder, "s")).raw
    assert raw["calls"][0]["arguments"] == {"card_number": "[redacted]", "holder": 5}


def s02_misspelled_tool_name(folder: Path) -> None:
    bad = _calls("tokenise", {"card_number": CARD, "holder": "Ada"})
    outcome = run(folder, agent([bad], max_invalid_proposals=0))
    assert outcome.reason is TerminalReason.INVALID_DECISION
    raw = rejection(history(folder, "s")).raw
    assert raw["calls"][0]["name"] == "tokenise"
    assert raw["calls"][0]["arguments"]["dropped"] is True


def s03_whole_proposal_as_json_text(folder: Path) -> None:
    text = json.dumps(_calls("tokenize", {"card_number": CARD, "holder": 5}))
    outcome = run(folder, agent([text], max_invalid_proposals=0))
    assert outcome.reason is TerminalReason.INVALID_DECISION
    raw = rejection(history(folder, "s")).raw
    assert raw["calls"][0]["arguments"]["card_number"] == "[redacted]"


def s04_calls_not_a_list(folder: Path) -> None:
    bad = {
        "kind": "tool_calls",
        "calls": {"id": "c", "name": "tokenize", "arguments": {"card_number": CARD}},
    }
    outcome = run(folder, agent([bad], max_invalid_proposals=0))
    assert outcome.reason is TerminalReason.INVALID_DECISION
    raw = rejection(history(folder, "s")).raw
    assert raw["calls"]["dropped"] is True


def s05_value_error_quoting_the_card(folder: Path) -> None:
    run(folder, agent([_calls("check_card", {"card_number": CARD}), FINAL]))
    assert error_messages(history(folder, "s")) == ["ValueError: card [redacted] has expired"]


def s06_tool_error_quoting_the_card(folder: Path) -> None:
    run(folder, agent([_calls("verify_card", {"card_number": CARD}), FINAL]))
    assert error_messages(history(folder, "s")) == ["card [redacted] is on a block list"]


def s07_connection_error_of_a_write(folder: Path) -> None:
    Service.reachable = False
    outcome = run(folder, agent([_calls("charge", {"card_number": CARD, "amount": 5}), FINAL]))
    assert outcome.reason is TerminalReason.RECONCILIATION_REQUIRED
    reasons = [r for r in effect_reasons(folder, "s") if r]
    assert reasons == ["ConnectionError: connection reset while charging [redacted]"]


def s08_receipt_reconciled_on_resume(folder: Path) -> None:
    from tests.support.cli import run_cli

    (folder / "payer_app.py").write_text(Path(__file__).read_text())
    db = f"sqlite:///{folder / 'events.db'}"
    crashed = run_cli(
        "run", "payer_app:AGENT", "--goal", "pay", "--id", "s", "--db", db,
        cwd=folder, env={"LOOP_ACTORS_CRASH_AT": "after_write_returned"}, timeout=60,
    )  # fmt: skip
    assert crashed.returncode == -9, crashed.stderr
    # The resumed process finds the service reachable: it says the write committed.
    (folder / "payer_app.py").write_text(
        Path(__file__).read_text() + "\nService.reachable = True\n"
    )
    resumed = run_cli("resume", "s", "--agent", "payer_app:AGENT", "--db", db, cwd=folder)
    assert resumed.returncode == 0, resumed.stderr
    results = [e for e in history(folder, "s") if isinstance(e, ResultsCommitted)]
    result = results[0].results[0]
    assert result.effect_status is EffectStatus.RECONCILED
    assert result.output["token"] == "[redacted]"  # type: ignore[index,call-overload]


def _pause_then_cancel(folder: Path, runtime: Runtime) -> None:
    async def go() -> None:
        Service.reachable = False
        outcome = await runtime.run(
            agent([_calls("charge", {"card_number": CARD, "amount": 5}), FINAL]),
            "pay",
            invocation_id="s",
        )
        assert outcome.reason is TerminalReason.RECONCILIATION_REQUIRED
        await runtime.request_cancel("s", by="ops", reason="give up")

    trio.run(go)


def s09_receipt_settled_by_the_sweeper(folder: Path) -> None:
    runtime = Runtime(f"sqlite:///{folder / 'events.db'}")
    _pause_then_cancel(folder, runtime)
    Service.reachable, Service.resolution = True, "committed"
    report = trio.run(runtime.reconcile, agent([FINAL]))
    assert report.effects_settled == 1
    reconciled = effect_events(folder, "s")[-1]
    assert type(reconciled).__name__ == "EffectReconciled"
    assert reconciled.receipt["token"] == "[redacted]"


def s10_sensitive_output(folder: Path) -> None:
    run(folder, agent([_calls("tokenize", {"card_number": CARD, "holder": "Ada"}), FINAL]))
    results = [e for e in history(folder, "s") if isinstance(e, ResultsCommitted)]
    assert results[0].results[0].output["token"] == "[redacted]"  # type: ignore[index,call-overload]


def s11_sensitive_argument_dispatched(folder: Path) -> None:
    run(folder, agent([_calls("pay", {"card_number": CARD, "amount": 5}), FINAL]))
    proposed = [e for e in history(folder, "s") if isinstance(e, DecisionProposed)]
    assert proposed[0].decision.calls[0].arguments["card_number"] == "[redacted]"  # type: ignore[union-attr]


def s12_rejected_known_tool_arguments(folder: Path) -> None:
    script = [
        _calls("tokenize", {"card_number": CARD, "holder": 5}),
        _calls("tokenize", {"card_numbr": CARD, "holder": "Ada"}),
    ]
    outcome = run(folder, agent(script, max_invalid_proposals=1))
    assert outcome.reason is TerminalReason.INVALID_DECISION
    rejected = [e.rejection for e in history(folder, "s") if isinstance(e, DecisionProposed)]
    assert rejected[0].raw["calls"][0]["arguments"]["card_number"] == "[redacted]"  # type: ignore[union-attr,index,call-overload]
    assert rejected[1].raw["calls"][0]["arguments"]["card_numbr"]["dropped"] is True  # type: ignore[union-attr,index,call-overload]


def s13_validation_error_quoting_the_card(folder: Path) -> None:
    outcome = run(
        folder,
        agent([_calls("strict_card", {"card_number": CARD})], max_invalid_proposals=0),
    )
    assert outcome.reason is TerminalReason.INVALID_DECISION
    problems = rejection(history(folder, "s")).problems
    assert "[redacted] is not a card we accept" in problems[0]
    ended = [e for e in history(folder, "s") if isinstance(e, Terminated)]
    assert "[redacted] is not a card we accept" in (ended[0].detail or "")


def s14_rejection_reason_on_resume(folder: Path) -> None:
    runtime = Runtime(f"sqlite:///{folder / 'events.db'}")

    async def go() -> None:
        Service.reachable, Service.resolution = False, "rejected"
        the_agent = agent([_calls("charge", {"card_number": CARD, "amount": 5}), FINAL])
        paused = await runtime.run(the_agent, "pay", invocation_id="s")
        assert paused.reason is TerminalReason.RECONCILIATION_REQUIRED
        Service.reachable = True
        resumed = await runtime.resume("s", the_agent)
        assert resumed.reason is TerminalReason.COMPLETED

    trio.run(go)
    assert error_messages(history(folder, "s")) == ["card [redacted] was declined"]
    assert any(r == "card [redacted] was declined" for r in effect_reasons(folder, "s"))


def s15_rejection_reason_by_the_sweeper(folder: Path) -> None:
    runtime = Runtime(f"sqlite:///{folder / 'events.db'}")
    _pause_then_cancel(folder, runtime)
    Service.reachable, Service.resolution = True, "rejected"
    report = trio.run(runtime.reconcile, agent([FINAL]))
    assert report.effects_settled == 1
    reason = effect_reasons(folder, "s")[-1]
    assert reason is not None
    assert reason.startswith("[withheld:")


def s16_approved_call_resumed_by_another_runtime(folder: Path, store_kind: str) -> None:
    url = f"sqlite:///{folder / 'events.db'}"
    the_agent = agent([_calls("refund", {"card_number": CARD}), FINAL])
    paused = Runtime(url).run_sync(the_agent, "refund", invocation_id="s")
    assert paused.reason is TerminalReason.APPROVAL_REQUIRED
    assert paused.digest is not None

    async def approve_and_resume() -> None:
        async with Runtime(url) as runtime:  # another runtime: nothing in its memory
            await runtime.approve("s", digest=paused.digest or "", by="ops")
            await runtime.resume("s", the_agent)

    trio.run(approve_and_resume)
    if store_kind == "encrypted":  # the sealed secret store gave the card back: it ran
        assert error_messages(history(folder, "s")) == [
            "ValueError: card [redacted] cannot be refunded"
        ]
    else:  # nothing kept the card: the call did not run
        assert "not run" in error_messages(history(folder, "s"))[0]


SCENARIOS: dict[str, Callable[..., None]] = {
    f.__name__: f
    for f in (
        s01_json_text_arguments_rejected,
        s02_misspelled_tool_name,
        s03_whole_proposal_as_json_text,
        s04_calls_not_a_list,
        s05_value_error_quoting_the_card,
        s06_tool_error_quoting_the_card,
        s07_connection_error_of_a_write,
        s08_receipt_reconciled_on_resume,
        s09_receipt_settled_by_the_sweeper,
        s10_sensitive_output,
        s11_sensitive_argument_dispatched,
        s12_rejected_known_tool_arguments,
        s13_validation_error_quoting_the_card,
        s14_rejection_reason_on_resume,
        s15_rejection_reason_by_the_sweeper,
        s16_approved_call_resumed_by_another_runtime,
    )
}


@pytest.fixture(params=["plain", "encrypted"])
def store_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "encrypted":
        from eventsourcing.cipher import AESCipher

        monkeypatch.setenv("CIPHER_TOPIC", "eventsourcing.cipher:AESCipher")
        monkeypatch.setenv("CIPHER_KEY", AESCipher.create_key(16))
    Service.reachable, Service.resolution = False, "committed"
    return str(request.param)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_no_secret_is_in_any_database_file_after_the_scenario(
    scenario: str, store_kind: str, tmp_path: Path
) -> None:
    """See the module docstring for what each scenario feeds in."""
    if scenario.startswith("s16"):
        SCENARIOS[scenario](tmp_path, store_kind)
    else:
        SCENARIOS[scenario](tmp_path)
    build_read_models_and_grep(tmp_path)
