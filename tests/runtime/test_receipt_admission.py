"""One admission for every receipt: by hand (CLI, ``Runtime.resolve_effect``) and reconciled.

Every receipt goes through ``aggregates.effect.receipt_problem`` (the rules of every
stored JSON value in ``aggregates.values``); a refusal is a typed user error (exit 2
on the CLI), and nothing is recorded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.decisions import EffectStatus
from aggregates.effect import MAX_HAND_RECEIPT_BYTES, InvalidResolutionError, storable_receipt
from aggregates.turn import EffectAnswered, admit_receipt
from loop_actors import (
    Agent,
    EffectResolutionError,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    tool,
)
from loop_actors.cli import main
from loop_actors.store.store import EventStore
from tests.support.effects import KEY, api_agent, cli, ledger, paused_project, paused_run
from tests.support.replies import FINAL, calls
from tests.support.runs import drive

pytestmark = pytest.mark.slow

HUGE_INT = 2**70
TEN_MB = "x" * 10_000_000
UNREFUSED = ["EffectPrepared", "EffectDispatched", "EffectOutcomeUnknown"]


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.fixture
def db_url(store_url: str) -> str:
    """Each test runs on a SQLite file and on PostgreSQL."""
    return store_url


@pytest.fixture(scope="module")
def paused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return paused_project(tmp_path_factory.mktemp("receipts") / "project")


@pytest.mark.parametrize(
    ("receipt", "message"),
    [
        ("[" * 500 + "]" * 500, "nested deeper than 64 levels"),
        ("[" * 60_000 + "]" * 60_000, "nested deeper than 64 levels"),
        (str(HUGE_INT), "an integer outside the signed 64-bit range"),
        ('{"n": ' + str(-HUGE_INT) + "}", "an integer outside the signed 64-bit range"),
        ("NaN", "NaN is not JSON"),
        ("Infinity", "Infinity is not JSON"),
        ('{"x": [1, -Infinity]}', "-Infinity is not JSON"),
    ],
    ids=["500-nested", "60000-nested", "2**70", "-2**70", "NaN", "Infinity", "-Infinity"],
)
def test_the_cli_refuses_an_unstorable_receipt_with_exit_2_and_records_nothing(
    paused: Path, receipt: str, message: str
) -> None:
    """Tried: 500 and 60,000 nested lists (a command line holds 128 KiB), ±2**70, NaN,
    Infinity, -Infinity in a list."""
    refused = cli(
        paused, "effects", "resolve", KEY, "--committed", "--receipt", receipt, "--by", "a"
    )
    assert refused.returncode == 2, refused.stderr
    assert message in refused.stderr
    assert "internal error" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert [r["type"] for r in ledger(paused)] == UNREFUSED


def test_the_cli_refuses_a_10_mb_receipt_with_exit_2_and_records_nothing(
    paused: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In process: a 10 MB argument is more than a command line holds (E2BIG)."""
    db = f"sqlite:///{paused / 'store.db'}"
    receipt = f'"{TEN_MB}"'
    args = ["effects", "resolve", KEY, "--committed", "--receipt", receipt, "--by", "a"]
    assert main([*args, "--db", db]) == 2
    err = capsys.readouterr().err
    assert f"more than {MAX_HAND_RECEIPT_BYTES}" in err
    assert len(err.strip().splitlines()) == 1
    assert [r["type"] for r in ledger(paused)] == UNREFUSED


@pytest.mark.parametrize(
    ("receipt", "message"),
    [
        (nested(500), "nested deeper than 64 levels"),
        (nested(100_000), "cannot be stored as JSON"),
        (HUGE_INT, "an integer outside the signed 64-bit range"),
        ({"id": [HUGE_INT]}, "an integer outside the signed 64-bit range"),
        (math.inf, "not JSON"),
        (TEN_MB, f"more than {MAX_HAND_RECEIPT_BYTES}"),
    ],
    ids=["500-nested", "100000-nested", "2**70", "2**70-inside", "inf", "10MB"],
)
async def test_runtime_resolve_effect_refuses_an_unstorable_receipt_and_records_nothing(
    db_url: str, receipt: Any, message: str
) -> None:
    """Tried: 500 and 100,000 nested lists, 2**70 alone and inside, Infinity, 10 MB."""
    with trio.fail_after(60):
        async with Runtime(db_url) as runtime:
            await paused_run(runtime, api_agent([]))
            with pytest.raises(EffectResolutionError, match=message):
                await runtime.resolve_effect(KEY, committed=True, receipt=receipt, by="alice")
    effect = EventStore(db_url).get_effect(KEY)
    assert effect is not None
    assert effect.status is EffectStatus.OUTCOME_UNKNOWN


def test_a_receipt_of_the_largest_size_is_admitted_and_one_byte_more_is_not() -> None:
    at_limit = "x" * (MAX_HAND_RECEIPT_BYTES - 2)  # two quotes
    assert storable_receipt(at_limit) == at_limit
    with pytest.raises(InvalidResolutionError, match="more than"):
        storable_receipt(at_limit + "x")
    assert storable_receipt(2**63 - 1) == 2**63 - 1


class _Redacts:
    """A catalogue whose tools redact nothing (what ``admit_receipt`` asks of it)."""

    def redact_output(self, tool: str, output: Any) -> Any:
        return output


@pytest.mark.parametrize("receipt", [HUGE_INT, {"id": -HUGE_INT}, nested(500)])
def test_the_core_refuses_a_reconciled_receipt_by_the_rules_of_a_hand_given_one(
    receipt: Any,
) -> None:
    """Tried: ±2**70 and 500 nested lists, as a service's answer."""
    answer = EffectAnswered(effect_key=KEY, status="committed", receipt=receipt)
    problem = admit_receipt(_Redacts(), "pay", answer, max_bytes=1_000)  # type: ignore[arg-type]
    assert isinstance(problem, str)
    assert problem.startswith("its receipt cannot be stored faithfully: ")
    with pytest.raises(InvalidResolutionError):
        storable_receipt(receipt)


async def test_a_reconciled_receipt_of_2_to_the_70_is_no_answer_the_effect_stays_open(
    db_url: str,
) -> None:
    @tool(effect="write", reconcile=lambda key: Reconciled(status="committed", receipt=HUGE_INT))
    def pay() -> str:
        """Lose the reply."""
        raise ConnectionError("lost")

    outcome, _ = await drive(
        Agent("a", ScriptedModel([calls(("w", "pay", {})), FINAL]), [pay]), db_url
    )
    assert outcome.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert "cannot be stored faithfully" in (outcome.detail or "")
    assert "64-bit" in (outcome.detail or "")
