"""Redaction rules without trio: rejected proposals, scrubbed texts, withheld reasons.

The proposals are redacted with a real :class:`Toolbox` (the catalogue a run uses);
the core's scrubbing is driven with the fake catalogue and the shell of
``tests/support/turn_core.py``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from aggregates.decisions import ToolEffect
from aggregates.effect import Resolution
from aggregates.invocation import ResultsCommitted, Terminated, VerificationFailed
from aggregates.redaction import (
    REDACTED,
    dropped,
    redact_proposal,
    redacted_values,
    scrub,
    withheld,
)
from aggregates.turn import (
    EffectAnswered,
    KeptSecret,
    ModelFailed,
    PolicyVerdict,
    RunCalls,
    ServiceUnreachable,
    TurnCore,
    settle_ended_effect,
)
from loop_actors import tool
from loop_actors.agent.tools import Toolbox
from tests.support.replies import calls, final
from tests.support.turn_core import (
    TOOLS,
    Answers,
    FakeCatalogue,
    FakeTool,
    Loaded,
    Shell,
    Verdict,
    failed,
    key_of,
    replayed_effect,
    replayed_invocation,
    unknown,
)

CARD = "4111111111111111"
PASSWORD = "correct-horse-battery"


@tool(sensitive_arguments=["card_number", "payer.card"])
def pay(card_number: str, amount: int, payer: dict[str, str] | None = None) -> str:
    """Pay."""
    return "paid"


@tool
def search(q: str) -> str:
    """Search."""
    return q


TOOLBOX = Toolbox([pay, search], default_timeout_s=1.0)
PLAIN = Toolbox([search], default_timeout_s=1.0)


def proposal(*items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"kind": "tool_calls", "calls": list(items), **extra}


def pay_call(arguments: Any, name: str = "pay") -> dict[str, Any]:
    return {"id": "p", "name": name, "arguments": arguments}


def digest(text: str) -> dict[str, Any]:
    data = text.encode()
    return {"dropped": True, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


# --------------------------------------------------------------------------- proposals


def test_arguments_given_as_json_text_are_redacted_after_parsing() -> None:
    text = json.dumps({"card_number": CARD, "amount": "x"})

    raw, found = redact_proposal(proposal(pay_call(text)), TOOLBOX)

    assert raw["calls"][0]["arguments"] == {"card_number": REDACTED, "amount": "x"}
    assert found == [CARD]


def test_a_whole_proposal_as_json_text_is_redacted_after_parsing() -> None:
    text = json.dumps(proposal(pay_call({"card_number": CARD, "amount": 1})))

    raw, _ = redact_proposal(text, TOOLBOX)

    assert raw == proposal(pay_call({"card_number": REDACTED, "amount": 1}))


def test_text_that_is_not_json_is_dropped_keeping_its_size_and_digest() -> None:
    """Tried: a whole proposal, a ``calls`` list and a call's arguments as broken JSON text."""
    broken = '{"card_number": "' + CARD + '", '

    assert redact_proposal(broken, TOOLBOX)[0] == digest(broken)
    assert redact_proposal(proposal(), TOOLBOX)[0] == proposal()
    assert redact_proposal({"kind": "tool_calls", "calls": broken}, TOOLBOX)[0] == {
        "kind": "tool_calls",
        "calls": digest(broken),
    }
    raw, _ = redact_proposal(proposal(pay_call(broken)), TOOLBOX)
    assert raw["calls"][0]["arguments"] == digest(broken)


def test_the_arguments_of_a_tool_the_agent_does_not_have_are_dropped() -> None:
    arguments = {"card_number": CARD, "amount": 1}

    raw, _ = redact_proposal(proposal(pay_call(arguments, name="payy")), TOOLBOX)

    assert raw["calls"][0] == {"id": "p", "name": "payy", "arguments": dropped(arguments)}


def test_calls_that_are_not_a_list_and_items_that_are_not_objects_are_dropped() -> None:
    """Tried: ``calls`` an object, a number; an item a list, a text holding the card."""
    one = pay_call({"card_number": CARD, "amount": 1})

    assert redact_proposal({"kind": "tool_calls", "calls": one}, TOOLBOX)[0]["calls"] == dropped(
        one
    )
    assert redact_proposal({"kind": "tool_calls", "calls": 5}, TOOLBOX)[0]["calls"] == dropped(5)
    raw, _ = redact_proposal(proposal([CARD], f"card {CARD}"), TOOLBOX)  # type: ignore[arg-type]
    assert raw["calls"] == [dropped([CARD]), digest(f"card {CARD}")]


def test_fields_the_decision_schema_does_not_name_are_dropped() -> None:
    """Tried: an unknown field of the proposal, of a call, and a non-scalar ``answer``."""
    bad = proposal(
        {"id": "p", "name": "pay", "args": {"card_number": CARD}, "arguments": {}},
        note=f"paying with {CARD}",
    )

    raw, _ = redact_proposal(bad, TOOLBOX)

    assert raw["note"] == digest(f"paying with {CARD}")
    assert raw["calls"][0]["args"] == dropped({"card_number": CARD})
    assert raw["calls"][0]["arguments"] == {}
    assert redact_proposal({"kind": "final", "answer": [CARD]}, TOOLBOX)[0] == {
        "kind": "final",
        "answer": dropped([CARD]),
    }


def test_an_argument_the_tool_does_not_have_is_dropped_as_maybe_a_misspelt_secret() -> None:
    raw, _ = redact_proposal(proposal(pay_call({"card_numbr": CARD, "amount": 1})), TOOLBOX)

    assert raw["calls"][0]["arguments"] == {"card_numbr": dropped(CARD), "amount": 1}


def test_a_nested_sensitive_argument_is_redacted_and_found() -> None:
    arguments = {"card_number": "x", "amount": "y", "payer": {"card": CARD, "name": "Ada"}}

    raw, found = redact_proposal(proposal(pay_call(arguments)), TOOLBOX)

    assert raw["calls"][0]["arguments"]["payer"] == {"card": REDACTED, "name": "Ada"}
    assert sorted(found) == sorted(["x", CARD])


def test_a_proposal_is_stored_as_it_is_when_no_tool_declares_sensitive_fields() -> None:
    text = json.dumps(proposal(pay_call({"q": 1}, name="search"))) + " trailing"

    assert redact_proposal(text, PLAIN) == (text, [])


# --------------------------------------------------------------------------- scrubbing


def test_scrub_replaces_a_value_as_it_is_and_as_json_or_repr_escape_it() -> None:
    tricky = 'pa"ss\\word'
    text = f"raw {tricky}, json {json.dumps(tricky)}, repr {tricky!r}"

    assert scrub(text, [tricky]) == f"raw {REDACTED}, json \"{REDACTED}\", repr '{REDACTED}'"


def test_scrub_replaces_the_longest_value_first_and_leaves_very_short_values() -> None:
    """Tried: a value inside another, and a two-character value (not searched for)."""
    assert scrub("card 4111111111111111 / 4111", ["4111", CARD, "41"]) == (
        f"card {REDACTED} / {REDACTED}"
    )
    assert scrub("a 41 b", ["41"]) == "a 41 b"


def test_redacted_values_are_the_texts_the_redaction_replaced() -> None:
    real = {"card": CARD, "pin": 1234, "payer": {"id": "u1", "cards": ["a1b2", "c3d4"]}, "x": 1}
    stored = {"card": REDACTED, "pin": REDACTED, "payer": {"id": "u1", "cards": REDACTED}, "x": 1}

    assert sorted(redacted_values(real, stored)) == sorted([CARD, "1234", "a1b2", "c3d4"])
    assert redacted_values(real, real) == []


def test_a_withheld_text_keeps_only_its_size_and_digest() -> None:
    text = f"card {CARD} was declined"

    stored = withheld(text, "why")

    assert CARD not in stored
    assert str(len(text)) in stored
    assert hashlib.sha256(text.encode()).hexdigest() in stored


# --------------------------------------------------------------------------- the core

SECRETIVE = {
    **TOOLS,
    "send": FakeTool(
        ToolEffect.WRITE, TOOLS["send"].arguments, sensitive_arguments=frozenset({"to"})
    ),
}


def login(password: str = PASSWORD) -> dict[str, Any]:
    return calls(("c1", "login", {"user": "ada", "password": password}))


def test_a_tool_error_quoting_a_sensitive_argument_is_stored_scrubbed() -> None:
    shell = Shell.over()
    shell.begin()
    run = shell.answer(login())
    assert isinstance(run, RunCalls)

    shell.ran(failed(run.calls[0], f"password {PASSWORD} is wrong"))

    result = shell.of_type(ResultsCommitted)[0].results[0]
    assert result.error is not None
    assert result.error.message == f"password {REDACTED} is wrong"


def test_a_resumed_core_scrubs_with_the_values_the_secret_store_holds() -> None:
    shell = Shell.over()
    shell.begin()
    run = shell.answer(login())
    assert isinstance(run, RunCalls)
    store: dict[tuple[int, str, str], Any] = {
        (s.step, s.call_id, s.kind): s.value for s in shell.core.take_secrets()
    }
    # The process dies after the dispatch commit; a new core has only the secret store.
    resumed = Shell.over(replayed_invocation(shell.committed))
    resumed.core = TurnCore(
        resumed.invocation,
        settings=resumed.core.settings,
        catalogue=resumed.core.catalogue,
        kept=lambda step, call_id, kind: store.get((step, call_id, kind)),
    )
    rerun = resumed.begin()
    assert isinstance(rerun, RunCalls)

    resumed.ran(failed(rerun.calls[0], f"password {PASSWORD} is wrong"))

    result = resumed.of_type(ResultsCommitted)[0].results[0]
    assert result.error is not None
    assert result.error.message == f"password {REDACTED} is wrong"


def test_a_services_reason_is_withheld_when_the_calls_real_arguments_are_not_held() -> None:
    shell = Shell.over(catalogue=FakeCatalogue(SECRETIVE))
    shell.begin()
    run = shell.answer(calls(("c1", "send", {"to": CARD})))
    assert isinstance(run, RunCalls)
    shell.ran(unknown(run.calls[0]))
    key = key_of(run, "c1")
    resumed = Shell.over(replayed_invocation(shell.committed), catalogue=FakeCatalogue(SECRETIVE))
    resumed.begin()
    resumed.feed(Loaded({key: replayed_effect(shell.committed, key)}))

    resumed.feed(Answers({key: ServiceUnreachable(effect_key=key, error=f"no route for {CARD}")}))

    assert resumed.paused.question is not None
    assert CARD not in resumed.paused.question
    assert "[withheld:" in resumed.paused.question


def test_a_services_reason_is_scrubbed_when_the_call_ran_in_this_core() -> None:
    shell = Shell.over(catalogue=FakeCatalogue(SECRETIVE))
    shell.begin()
    run = shell.answer(calls(("c1", "send", {"to": CARD})))
    assert isinstance(run, RunCalls)
    shell.ran(unknown(run.calls[0]))
    key = key_of(run, "c1")

    shell.feed(
        Answers(
            {
                key: EffectAnswered(
                    effect_key=key, status=Resolution.REJECTED, reason=f"{CARD} is blocked"
                )
            }
        )
    )

    result = shell.of_type(ResultsCommitted)[0].results[0]
    assert result.error is not None
    assert result.error.message == f"{REDACTED} is blocked"
    assert shell.effect_events(key)[-1].reason == f"{REDACTED} is blocked"  # type: ignore[attr-defined]


def test_a_policys_refusal_quoting_a_sensitive_argument_is_scrubbed() -> None:
    shell = Shell.over(authorises=True)
    shell.begin()
    shell.answer(login())

    shell.feed(PolicyVerdict(refused={"c1": f"{PASSWORD} is a banned password"}))

    result = shell.of_type(ResultsCommitted)[0].results[0]
    assert result.error is not None
    assert PASSWORD not in result.error.message
    assert REDACTED in result.error.message


def test_a_model_failure_and_a_verifiers_evidence_are_scrubbed_of_the_runs_secrets() -> None:
    """Tried: a model error and a verifier's evidence, each quoting an argument seen earlier."""
    shell = Shell.over(verifies=True)
    shell.begin()
    run = shell.answer(login())
    assert isinstance(run, RunCalls)
    shell.ran(failed(run.calls[0]))
    shell.answer(final("logged in"))
    shell.feed(Verdict(f"the answer leaks {PASSWORD}"))
    assert shell.of_type(VerificationFailed)[0].evidence == f"the answer leaks {REDACTED}"

    shell.feed(ModelFailed(error_type="BadRequest", message=f"prompt holds {PASSWORD}"))

    assert shell.of_type(Terminated)[0].detail == f"BadRequest: prompt holds {REDACTED}"


def test_the_sweeper_redacts_a_receipt_and_withholds_a_reason_it_cannot_scrub() -> None:
    shell = Shell.over(catalogue=FakeCatalogue(SECRETIVE))
    shell.begin()
    run = shell.answer(calls(("c1", "send", {"to": CARD})))
    assert isinstance(run, RunCalls)
    shell.ran(unknown(run.calls[0]))
    key = key_of(run, "c1")
    effect = replayed_effect(shell.committed, key)
    invocation = replayed_invocation(shell.committed)
    answer = EffectAnswered(effect_key=key, status=Resolution.REJECTED, reason=f"{CARD} blocked")

    settle_ended_effect(
        invocation, effect, answer, FakeCatalogue(SECRETIVE), max_bytes=100_000, at=shell.now.at
    )

    assert effect.reason is not None
    assert effect.reason.startswith("[withheld:")


def test_the_sweeper_scrubs_a_reason_of_the_receipts_sensitive_values() -> None:
    minting = {
        **TOOLS,
        "send": FakeTool(
            ToolEffect.WRITE, TOOLS["send"].arguments, sensitive_output=frozenset({"token"})
        ),
    }
    shell = Shell.over(catalogue=FakeCatalogue(minting))
    shell.begin()
    run = shell.answer(calls(("c1", "send", {"to": "bob"})))
    assert isinstance(run, RunCalls)
    shell.ran(unknown(run.calls[0]))
    key = key_of(run, "c1")
    effect = replayed_effect(shell.committed, key)
    answer = EffectAnswered(
        effect_key=key,
        status=Resolution.COMMITTED,
        receipt={"token": "tok_live_123", "id": 1},
        reason="issued tok_live_123",
    )

    settle_ended_effect(
        replayed_invocation(shell.committed),
        effect,
        answer,
        FakeCatalogue(minting),
        max_bytes=100_000,
        at=shell.now.at,
    )

    assert effect.receipt == {"token": REDACTED, "id": 1}
    assert effect.reason == f"issued {REDACTED}"


def test_kept_secrets_are_still_handed_to_the_runtime() -> None:
    shell = Shell.over()
    shell.begin()
    shell.answer(login())

    secrets = shell.core.take_secrets()

    assert secrets == [
        KeptSecret(
            step=1,
            call_id="c1",
            kind="arguments",
            value={"user": "ada", "password": PASSWORD, "limit": 10},
        )
    ]
