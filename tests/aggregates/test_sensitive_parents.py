"""A secret under a sensitive path whose parent is not an object is never stored (issue 33, D).

With ``sensitive_arguments=["payer.card"]`` and ``{"payer": '{"card": "4111…"}'}`` (the
parent as JSON text, not an object) the card used to be stored in clear: in the
refused proposal, the read models and ``history --json``, with or without the cipher.
Now a value on a sensitive path that the path must go through and that is not an
object is dropped (size and SHA-256) in a refused proposal, and redacted whole in a
call that runs (a tool whose type accepts any ``payer``); ``null`` and booleans hold
nothing and are kept where a call runs.

Shapes of the parent tried (drawn by hypothesis, nested in one another): an object
holding the card (as text, as a number, in a list, in an object, as JSON text), that
object as JSON text (compact, indented, with other keys), a list of those, JSON text
of JSON text, text that quotes the card but is not JSON, the card as a number or a
float, ``null``, booleans, other numbers and texts; the whole arguments as JSON text
too. Each through a tool that refuses it (``payer: dict[str, str]``) and one that runs
it (``payer: Any``), including one that raises quoting the card it parsed out of the
text. Checked: the card's text is in no stored row's bytes (the store, its WAL, the
read models), nor in ``history --json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregates.audit import event_body
from aggregates.invocation import DecisionProposed, Invocation, ResultsCommitted
from aggregates.redaction import REDACTED, dropped, redact_paths, redact_proposal
from aggregates.settings import RunSettings
from aggregates.turn import ModelAnswered, Moment, TurnCore
from loop_actors import Agent, Budget, Runtime, ScriptedModel, tool
from loop_actors.agent.tools import Toolbox
from loop_actors.store.read_models import open_runner
from loop_actors.store.store import EventStore
from tests.support.cli import run_in_process
from tests.support.stored_bytes import readable_bytes

CARD = "4111111111111111"
AT = Moment(at=datetime(2026, 1, 1, tzinfo=UTC), elapsed_s=0.0)


@tool(sensitive_arguments=["payer.card"])
def strict(payer: dict[str, str], amount: int) -> str:
    """Charge a payer given as an object (anything else is refused)."""
    return "charged"


@tool(sensitive_arguments=["payer.card"])
def loose(payer: Any) -> str:
    """Charge a payer of any shape."""
    return "charged"


@tool(sensitive_arguments=["payer.card"])
def declining(payer: Any) -> str:
    """Parse the payer's text and decline its card, quoting it."""
    card = json.loads(payer)["card"] if isinstance(payer, str) else "?"
    raise ValueError(f"card {card} declined")


TOOLS = [strict, loose, declining]
TOOLBOX = Toolbox(TOOLS, default_timeout_s=5.0)


# --------------------------------------------------------------------------- shapes


def _text(value: Any, indent: int | None) -> str:
    return json.dumps(value, indent=indent)


CARD_FORMS = st.sampled_from([CARD, int(CARD), [CARD], {"number": CARD}, json.dumps(CARD)])
HOLDERS: st.SearchStrategy[Any] = st.recursive(
    st.builds(lambda card: {"card": card}, CARD_FORMS)
    | st.builds(lambda card: {"name": "Ann", "card": card}, CARD_FORMS),
    lambda inner: st.one_of(
        st.builds(_text, inner, st.sampled_from([None, 2])),
        st.lists(inner, min_size=1, max_size=2),
    ),
    max_leaves=3,
)
PARENTS: st.SearchStrategy[Any] = st.one_of(
    HOLDERS,
    HOLDERS.map(json.dumps),
    st.sampled_from(
        [
            f"card={CARD}",
            CARD,
            int(CARD),
            float(CARD),
            [CARD],
            [[CARD]],
            None,
            True,
            False,
            7,
            "plain",
            [],
            {},
        ]
    ),
)


def _calls(name: str, arguments: Any) -> dict[str, Any]:
    return {"kind": "tool_calls", "calls": [{"id": "c", "name": name, "arguments": arguments}]}


def _arguments(name: str, parent: Any, as_text: bool) -> Any:
    arguments: dict[str, Any] = {"payer": parent}
    if name == "strict":
        arguments["amount"] = 1
    return json.dumps(arguments) if as_text else arguments


def _no_card(data: bytes | str, where: str) -> None:
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    assert CARD not in text, f"the card is in {where}"


# --------------------------------------------------------------------------- the rule


def test_a_parent_that_is_not_an_object_is_redacted_whole_where_the_path_goes_through() -> None:
    """Tried: JSON text, plain text, a number, a float; kept: null, booleans, the top."""
    paths = [("payer", "card")]
    for parent in (json.dumps({"card": CARD}), f"card={CARD}", int(CARD), float(CARD)):
        assert redact_paths({"payer": parent}, paths) == {"payer": REDACTED}
    for kept in (None, True, False):
        assert redact_paths({"payer": kept}, paths) == {"payer": kept}
    assert redact_paths({"payer": [{"card": CARD}, CARD]}, paths) == {
        "payer": [{"card": REDACTED}, REDACTED]
    }
    assert redact_paths({"payer": {"card": CARD}}, paths) == {"payer": {"card": REDACTED}}
    output = "an output that is not an object"
    assert redact_paths(output, [("token",)]) is output


def test_a_refused_proposal_drops_a_parent_given_as_json_text_with_its_size_and_digest() -> None:
    """The case of the issue: ``{"payer": '{"card": "4111…"}'}`` for ``payer.card``."""
    parent = json.dumps({"card": CARD})

    raw, found = redact_proposal(_calls("strict", {"payer": parent, "amount": 1}), TOOLBOX)

    assert raw["calls"][0]["arguments"] == {"payer": dropped(parent), "amount": 1}
    assert CARD in found  # so that a problem quoting it is scrubbed


def test_a_refused_proposal_drops_null_and_boolean_parents_too() -> None:
    for parent in (None, True, 5, [CARD]):
        raw, _ = redact_proposal(_calls("strict", {"payer": parent, "amount": 1}), TOOLBOX)
        payer = raw["calls"][0]["arguments"]["payer"]
        expected = [dropped(CARD)] if isinstance(parent, list) else dropped(parent)
        assert payer == expected, parent


@settings(max_examples=150, deadline=None, database=None)
@given(
    name=st.sampled_from(["strict", "loose"]),
    parent=PARENTS,
    as_text=st.booleans(),
)
def test_no_shape_of_a_parent_puts_the_card_into_an_event(
    name: str, parent: Any, as_text: bool
) -> None:
    """The turn core over a real Toolbox: refused or run, every event is free of the card."""
    invocation = Invocation.start(
        invocation_id="i",
        goal="pay",
        agent_name="a",
        agent_version="1",
        catalogue_digest=TOOLBOX.catalogue_digest,
        tools=TOOLBOX.specs,
        budget=Budget(),
        settings=RunSettings(),
        at=AT.at,
    )
    core = TurnCore(invocation, settings=RunSettings(), catalogue=TOOLBOX)
    core.next(AT)
    core.on_model(ModelAnswered(proposal=_calls(name, _arguments(name, parent, as_text))), AT)
    events = [*invocation.take_events(), *core.take_events()]
    assert any(isinstance(e, DecisionProposed) for e in events)
    for event in events:
        _no_card(event_body(event), type(event).__name__)


# --------------------------------------------------------------------------- through runs


@pytest.fixture(params=["plain", "encrypted"])
def store_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "encrypted":
        from eventsourcing.cipher import AESCipher

        monkeypatch.setenv("CIPHER_TOPIC", "eventsourcing.cipher:AESCipher")
        monkeypatch.setenv("CIPHER_KEY", AESCipher.create_key(16))
    return str(request.param)


def _files(folder: Path) -> Iterator[Path]:
    return (p for p in sorted(folder.iterdir()) if p.is_file() and ".db" in p.name)


def _check_folder(
    folder: Path,
    ids: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No card in the files (read models built), nor in ``history --json`` of each run."""
    url = f"sqlite:///{folder / 'events.db'}"
    store = EventStore(url)
    runner = open_runner(store)
    try:
        runner.catch_up()
        for path in _files(folder):
            _no_card(readable_bytes([path]), path.name)
    finally:
        runner.close()
        store.close()
    for path in _files(folder):
        _no_card(readable_bytes([path]), path.name)
    for invocation_id in ids:
        shown = run_in_process(
            "history",
            invocation_id,
            "--json",
            cwd=folder,
            capsys=capsys,
            monkeypatch=monkeypatch,
            db=url,
        )
        assert shown.returncode == 0, shown.stderr
        _no_card(shown.stdout, f"history --json {invocation_id}")
        _no_card(shown.stderr, f"history --json {invocation_id} (stderr)")


def _run(url: str, name: str, arguments: Any, invocation_id: str) -> None:
    script = [_calls(name, arguments), {"kind": "final", "answer": "done"}]
    agent = Agent("payer", ScriptedModel(script), TOOLS, max_invalid_proposals=1)

    async def go() -> None:
        with trio.fail_after(30):
            async with Runtime(url) as runtime:
                await runtime.run(agent, "pay", invocation_id=invocation_id)

    trio.run(go)


def test_a_card_in_a_parent_given_as_json_text_is_in_no_file_and_not_in_history(
    store_kind: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's case, refused (``strict``), run (``loose``), and run by a tool whose error
    quotes the card it parsed out of the text (``declining``)."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    parent = json.dumps({"card": CARD})
    _run(url, "strict", {"payer": parent, "amount": 1}, "refused")
    _run(url, "loose", {"payer": parent}, "run")
    _run(url, "declining", {"payer": parent}, "declined")
    _run(url, "strict", json.dumps({"payer": parent, "amount": 1}), "as-text")
    store = EventStore(url)
    try:
        refused = [e for e in store.events("refused") if isinstance(e, DecisionProposed)]
        assert refused[0].rejection is not None
        raw: Any = refused[0].rejection.raw
        arguments = raw["calls"][0]["arguments"]
        assert arguments["payer"] == dropped(parent)
        results = [e for e in store.events("declined") if isinstance(e, ResultsCommitted)]
        assert results[0].results[0].error is not None
        assert results[0].results[0].error.message == f"ValueError: card {REDACTED} declined"
    finally:
        store.close()
    _check_folder(tmp_path, ["refused", "run", "declined", "as-text"], capsys, monkeypatch)


def test_fuzzed_parents_through_runs_leave_no_card_in_files_history_or_read_models(
    store_kind: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    ids: list[str] = []

    @settings(
        max_examples=15,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(name=st.sampled_from(["strict", "loose"]), parent=PARENTS, as_text=st.booleans())
    def one(name: str, parent: Any, as_text: bool) -> None:
        invocation_id = f"f{len(ids)}"
        _run(url, name, _arguments(name, parent, as_text), invocation_id)
        ids.append(invocation_id)

    one()
    _check_folder(tmp_path, ids, capsys, monkeypatch)
