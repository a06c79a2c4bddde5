"""Secrets never reach the store: redaction of declared fields, and encryption at rest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.invocation import BatchDispatched, DecisionProposed, ResultsCommitted
from loop_actors import (
    Agent,
    ModelRequest,
    Runtime,
    ScriptedModel,
    StoreCipherError,
    TerminalReason,
    tool,
)
from loop_actors.store.store import EventStore

CARD = "4111111111111111"
TOKEN = "tok_live_9f8e7d6c5b4a"


@tool(sensitive_arguments=["card_number"], sensitive_output=["token"])
async def tokenize(card_number: str, holder: str) -> dict[str, Any]:
    """Turn a card into a token."""
    assert card_number == CARD  # the tool gets the real value
    return {"token": TOKEN, "last4": card_number[-4:], "holder": holder}


@tool(sensitive_arguments=["token"])
async def charge(token: str, amount: int) -> dict[str, Any]:
    """Charge a token."""
    assert token == TOKEN
    return {"charged": amount}


def decide(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [
                {
                    "id": "t",
                    "name": "tokenize",
                    "arguments": {"card_number": CARD, "holder": "Ada"},
                }
            ],
        }
    if request.step == 2:
        # The model still sees the real token in this process, and uses it.
        token = request.results[0].output["token"]  # type: ignore[index,call-overload]
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c", "name": "charge", "arguments": {"token": token, "amount": 12}}],
        }
    return {"kind": "final", "answer": "charged 12"}


AGENT = Agent("payer", ScriptedModel(decide), [tokenize, charge])


def all_bytes(folder: Path) -> bytes:
    # Imported here: this file is also the agent module the CLI loads (see below).
    from tests.support.stored_bytes import readable_bytes

    return readable_bytes(path for path in sorted(folder.iterdir()) if path.is_file())


def test_redacted_fields_never_appear_in_the_database_files(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"

    async def go() -> Any:
        async with Runtime(url, follow_projections=True) as runtime:
            outcome = await runtime.run(AGENT, "pay", invocation_id="pay-1")
            assert runtime.projections is not None
            await trio.to_thread.run_sync(runtime.projections.catch_up)
            return outcome, await runtime.history("pay-1")

    outcome, events = trio.run(go)
    assert outcome.reason is TerminalReason.COMPLETED
    # Checkpoint the WAL so that every byte is in the files grepped below.
    store = EventStore(url)
    store.close()
    data = all_bytes(tmp_path)
    assert CARD.encode() not in data
    assert TOKEN.encode() not in data
    assert b"Ada" in data  # what is not declared sensitive is stored as usual

    decided = next(e for e in events if isinstance(e, DecisionProposed))
    assert decided.decision is not None
    assert decided.decision.calls[0].arguments["card_number"] == "[redacted]"  # type: ignore[union-attr]
    dispatched = [e for e in events if isinstance(e, BatchDispatched)]
    assert dispatched[1].calls[0].arguments["token"] == "[redacted]"
    results = [e for e in events if isinstance(e, ResultsCommitted)]
    assert results[0].results[0].output == {"token": "[redacted]", "last4": "1111", "holder": "Ada"}


def test_a_rejected_proposal_is_stored_redacted_too(tmp_path: Path) -> None:
    bad = {
        "kind": "tool_calls",
        "calls": [
            {"id": "t", "name": "tokenize", "arguments": {"card_number": CARD, "holder": 5}},
        ],
    }
    agent = Agent("payer", ScriptedModel([bad]), [tokenize, charge], max_invalid_proposals=0)
    outcome = Runtime(f"sqlite:///{tmp_path / 'events.db'}").run_sync(agent, "pay")
    assert outcome.reason is TerminalReason.INVALID_DECISION
    EventStore(f"sqlite:///{tmp_path / 'events.db'}").close()
    assert CARD.encode() not in all_bytes(tmp_path)


def test_after_a_restart_a_call_whose_arguments_were_redacted_is_not_run_blind(
    tmp_path: Path,
) -> None:
    # Imported here: this file is also the agent module the CLI loads, from a folder
    # where the tests package is not importable.
    from tests.support.cli import run_cli

    folder = tmp_path
    (folder / "payer_app.py").write_text(Path(__file__).read_text())
    crashed = run_cli(
        "run", "payer_app:AGENT", "--goal", "pay", "--id", "p", "--json",
        cwd=folder, env={"LOOP_ACTORS_CRASH_AT": "after_dispatch_commit:2"}, timeout=60,
    )  # fmt: skip
    assert crashed.returncode == -9, crashed.stderr
    resumed = run_cli("resume", "p", "--agent", "payer_app:AGENT", "--json", cwd=folder, timeout=60)
    # The scripted model goes on to its answer; the charge itself did not run again.
    assert resumed.returncode == 0, resumed.stderr
    history = run_cli("history", "p", "--json", cwd=folder, timeout=60)
    results = [
        json.loads(line)["data"]["results"]
        for line in history.stdout.splitlines()
        if json.loads(line)["type"] == "ResultsCommitted"
    ]
    assert results[1][0]["error"]["error_class"] == "invalid_arguments"
    assert "redacted" in results[1][0]["error"]["message"]


@pytest.fixture
def cipher_env(monkeypatch: pytest.MonkeyPatch) -> str:
    from eventsourcing.cipher import AESCipher

    key = AESCipher.create_key(16)
    monkeypatch.setenv("CIPHER_TOPIC", "eventsourcing.cipher:AESCipher")
    monkeypatch.setenv("CIPHER_KEY", key)
    return key


def test_events_are_encrypted_at_rest_with_eventsourcing_cipher_settings(
    tmp_path: Path, cipher_env: str
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    goal = "a goal that must not be readable on disk"
    outcome = Runtime(url).run_sync(AGENT, goal, invocation_id="enc")
    assert outcome.reason is TerminalReason.COMPLETED
    store = EventStore(url)
    events = store.events("enc")
    store.close()
    assert events[0].goal == goal  # type: ignore[attr-defined]
    data = (tmp_path / "events.db").read_bytes()
    assert goal.encode() not in data
    assert b"charged" not in data


def test_an_encrypted_store_cannot_be_read_without_the_key(
    tmp_path: Path, cipher_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    Runtime(url).run_sync(AGENT, "secret goal", invocation_id="enc")
    monkeypatch.delenv("CIPHER_TOPIC")
    monkeypatch.delenv("CIPHER_KEY")
    with pytest.raises(StoreCipherError, match="encrypted"):
        EventStore(url)


async def test_plans_that_differ_only_in_a_secret_argument_count_as_the_same_plan() -> None:
    # The aggregate sees only the stored (redacted) calls, so the controller must judge
    # repetition on the same calls: two cards redact alike, and the run ends in
    # no_progress, as the aggregate would insist, instead of failing inside it.
    @tool(sensitive_arguments=["card_number"])
    async def check_card(card_number: str) -> str:
        """Check a card."""
        return "declined"

    def propose(request: ModelRequest) -> dict[str, Any]:
        card = f"41111111111111{request.step:02d}"
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c", "name": "check_card", "arguments": {"card_number": card}}],
        }

    agent = Agent("cards", ScriptedModel(propose), [check_card])
    outcome = await Runtime("memory://").run(agent, "check the cards")
    assert outcome.reason is TerminalReason.NO_PROGRESS
    assert outcome.tool_calls == 1
