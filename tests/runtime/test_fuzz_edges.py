"""Fuzzing the edges: whatever a model, a tool or a service gives, every run ends typed.

Each example is a full run (``follow_projections=True``) on one SQLite file of a
model whose replies, usage, tool outputs and receipts are drawn by hypothesis from
values that once broke the store. Inputs tried:

* numbers: NaN, ±Infinity, ``1e400`` in JSON text, negative and huge integers
  (past 64 bits), negative tokens and costs in ``Usage``;
* strings: lone surrogates (``\\ud800``, ``\\udcff``), ``os.listdir``-style names
  decoded with ``surrogateescape``, terminal escapes (``\\x1b[31m``), huge strings
  (300 KB, 2 MB);
* nesting: lists nested 1-300 and 2000 levels, as values and as JSON text;
* non-JSON objects: sets, tuples, bytes (also not UTF-8), an object whose ``__str__``
  and ``__repr__`` raise, a cycle;
* replies: final answers, questions, tool batches (known, unknown and duplicate ids),
  whole proposals as JSON text or bytes, a decide() that raises KeyboardInterrupt,
  SystemExit or a custom BaseException;
* decision models built with ``model_construct`` (every variant, any drawn value or
  none in its field, a ``kind`` of another variant, ``schema_version`` 7, constructed
  ``ToolCall`` s), a ``ModelReply`` without a proposal, a usage that is not a ``Usage``;
* tools that return any of the above or raise those exceptions, or a ``ToolError``
  whose class is none of the runtime's; a write whose reply is lost and whose
  ``reconcile`` answers a drawn receipt, a ``Reconciled`` built with ``model_construct``
  (a bogus, missing or int status, an int or nasty reason), or raises;
* a policy that allows, denies, or answers a ``Deny`` built with ``model_construct``.

Every run ends with a typed outcome; every invocation loads, its history reads and its
chains verify; afterwards ``history``, ``show``, ``list``, ``metrics`` and
``audit verify`` succeed on the database in subprocesses, without a traceback.
``bench/fuzz_edges.py --examples 2000`` is the long run.
"""

from __future__ import annotations

import math
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from loop_actors import (
    Agent,
    Budget,
    CannotContinue,
    Clarification,
    Deny,
    Final,
    ModelReply,
    ModelRequest,
    Reconciled,
    RequestApproval,
    Runtime,
    TerminalReason,
    ToolCall,
    ToolCalls,
    ToolError,
    Usage,
    tool,
)
from loop_actors.audit.verify import verify_invocation
from loop_actors.store.store import EventStore
from tests.support.cli import CLI, cli_env
from tests.support.constructed import constructed

pytestmark = pytest.mark.slow


class Custom(BaseException):
    """A BaseException of the user's own."""


class Broken:
    """An object that cannot be turned into text at all."""

    def __str__(self) -> str:
        raise ValueError("no str")

    def __repr__(self) -> str:
        raise KeyboardInterrupt


def nest(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def cycle() -> Any:
    loop: list[Any] = []
    loop.append(loop)
    return loop


NASTY_TEXT = st.sampled_from(
    [
        "\ud800",
        "a\udcffb",
        os.fsdecode(b"file-\xff\xfe.txt"),
        "\x1b[31mred\x1b[0m",
        "\x9b2J",
        "plain",
        "",
        "é✓😀",
    ]
)
HUGE_TEXT = st.sampled_from([300_000, 2_000_000]).map(lambda n: "h" * n)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 2**63, -(2**64)]),
)
OBJECTS = st.sampled_from(["set", "tuple", "bytes", "bad-bytes", "broken", "cycle"]).map(
    lambda kind: {
        "set": lambda: {1, "a"},
        "tuple": lambda: (1, "t"),
        "bytes": lambda: b"ok bytes",
        "bad-bytes": lambda: b"\xff\xfe",
        "broken": Broken,
        "cycle": cycle,
    }[kind]()
)
SCALARS = st.one_of(
    st.none(), st.booleans(), NUMBERS, st.text(max_size=20), NASTY_TEXT, HUGE_TEXT, OBJECTS
)
TREES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.one_of(st.text(max_size=5), NASTY_TEXT), children, max_size=3)
    ),
    max_leaves=8,
)
VALUES = st.integers(min_value=0, max_value=9).flatmap(
    lambda odd: st.sampled_from([1, 60, 65, 300, 2_000]).map(nest) if odd == 0 else TREES
)
JSON_TEXT = st.one_of(
    st.sampled_from(
        [
            '{"value": NaN}',
            '{"value": 1e400}',
            '{"value": "\\ud800"}',
            '{"value": -Infinity}',
            "not json",
            '{"value": 1}',
        ]
    ),
    st.sampled_from([100, 1_000, 50_000]).map(lambda n: '{"value": ' + "[" * n + "]" * n + "}"),
)
RAISING = st.sampled_from(
    ["KeyboardInterrupt", "SystemExit", "Custom", "BrokenStr", "ValueError", "BadToolError"]
)
USAGE_FIGURES: st.SearchStrategy[Any] = st.one_of(
    st.just(0), st.integers(min_value=-1_000, max_value=1_000), NUMBERS
)


def raise_named(name: str) -> None:
    class BrokenStr(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str")

    errors: dict[str, BaseException] = {
        "KeyboardInterrupt": KeyboardInterrupt(),
        "SystemExit": SystemExit(1),
        "Custom": Custom("mine"),
        "BrokenStr": BrokenStr(),
        "ValueError": ValueError("bad \udc80"),
        "BadToolError": ToolError("classless", error_class="bogus"),  # type: ignore[arg-type]
    }
    raise errors[name]


@st.composite
def calls(draw: st.DrawFn) -> dict[str, Any]:
    """A tool batch, mostly valid (so that tools run), sometimes not."""
    batch = []
    for index in range(draw(st.integers(min_value=1, max_value=3))):
        odd = draw(st.integers(min_value=0, max_value=19))
        name = "missing" if odd == 0 else draw(st.sampled_from(["produce", "pay"]))
        arguments: Any = {"i": draw(st.integers(min_value=0, max_value=20))}
        if odd in (1, 2):
            arguments = {"i": 0, "extra": draw(VALUES)}
        elif odd == 3:
            arguments = draw(JSON_TEXT)
        elif odd == 4:
            arguments = draw(VALUES)
        call_id = {5: "\udcff", 6: "same"}.get(odd, f"c{index}")
        batch.append({"id": call_id, "name": name, "arguments": arguments})
    return {"kind": "tool_calls", "calls": batch}


DECISION_FIELDS: dict[type[BaseModel], str] = {
    Final: "answer",
    ToolCalls: "calls",
    RequestApproval: "proposal_digest",
    Clarification: "question",
    CannotContinue: "reason",
}
FIELD_VALUES = st.one_of(SCALARS, TREES, st.just("valid"))


@st.composite
def constructed_decisions(draw: st.DrawFn) -> Any:
    """A decision model built with ``model_construct``: any value in its field, or none."""
    cls = draw(st.sampled_from(list(DECISION_FIELDS)))
    fields: dict[str, Any] = {}
    if draw(st.integers(min_value=0, max_value=5)):  # else the field is missing
        value = draw(FIELD_VALUES)
        if cls is ToolCalls and draw(st.booleans()):
            value = [
                constructed(
                    ToolCall,
                    id=draw(st.one_of(st.just("c1"), SCALARS)),
                    name=draw(st.sampled_from(["produce", "pay", 5])),
                    arguments=draw(st.one_of(st.just({"i": 1}), VALUES, JSON_TEXT)),
                )
            ]
        fields[DECISION_FIELDS[cls]] = value
    fields.update(draw(st.sampled_from([{}, {}, {"kind": "final"}, {"schema_version": 7}])))
    return constructed(cls, **fields)


REPLIES = st.integers(min_value=0, max_value=13).flatmap(
    lambda kind: {
        6: st.builds(lambda a: {"kind": "final", "answer": a}, st.one_of(NASTY_TEXT, HUGE_TEXT)),
        7: st.builds(lambda q: {"kind": "clarification", "question": q}, NASTY_TEXT),
        8: JSON_TEXT,
        9: st.sampled_from([b'{"kind": "final", "answer": "\xff"}', b"[" * 3000]),
        10: TREES,
        11: RAISING.map(lambda name: ("raise", name)),
        12: constructed_decisions(),
        13: st.just(("no-proposal", "")),
    }.get(kind, calls())
)


@st.composite
def usages(draw: st.DrawFn) -> Any:
    odd = draw(st.integers(min_value=0, max_value=19))
    if odd > 1:
        return Usage(input_tokens=10, output_tokens=5)
    if odd == 1:  # not a Usage at all, though it has every figure, or text
        return draw(
            st.sampled_from(
                [
                    SimpleNamespace(
                        input_tokens=1, output_tokens=1, cost=0.0, latency_ms=0.0, attempts=None
                    ),
                    "usage",
                ]
            )
        )
    return Usage.model_construct(
        input_tokens=draw(USAGE_FIGURES),
        output_tokens=draw(USAGE_FIGURES),
        cost=draw(USAGE_FIGURES),
        latency_ms=draw(USAGE_FIGURES),
        attempts=None,
    )


@dataclass
class Case:
    """One drawn run: the model's replies and usages, the tools' outputs, the receipts."""

    replies: list[Any]
    usages: list[Any]
    outputs: list[Any]
    receipt: Any
    verdict: Any = True


CASES = st.builds(
    Case,
    replies=st.lists(REPLIES, min_size=1, max_size=4),
    usages=st.lists(usages(), min_size=1, max_size=4),
    outputs=st.lists(
        st.one_of(VALUES, HUGE_TEXT, RAISING.map(lambda name: ("raise", name))),
        min_size=1,
        max_size=4,
    ),
    receipt=st.one_of(
        VALUES,
        RAISING.map(lambda name: ("raise", name)),
        st.builds(
            lambda status, reason, receipt: ("constructed", status, reason, receipt),
            st.sampled_from(["committed", "rejected", "not_found", "bogus", None, 5]),
            st.one_of(st.none(), st.just(5), NASTY_TEXT),
            VALUES,
        ),
    ),
    verdict=st.integers(min_value=0, max_value=5).flatmap(
        lambda odd: {
            3: st.just(Deny(reason="not today")),
            4: st.builds(
                lambda reason, stop: constructed(Deny, reason=reason, stop=stop),
                st.one_of(st.none(), st.just(5), NASTY_TEXT),
                st.sampled_from([True, False, "maybe", None]),
            ),
            5: st.just(constructed(Deny)),
        }.get(odd, st.just(True))
    ),
)


class DrawnModel:
    """Answers the drawn replies by step (then a plain final answer)."""

    def __init__(self, case: Case) -> None:
        self.case = case

    async def decide(self, request: ModelRequest) -> ModelReply:
        index = request.step - 1
        reply = self.case.replies[index] if index < len(self.case.replies) else None
        usage = self.case.usages[index % len(self.case.usages)]
        if isinstance(reply, tuple):
            if reply[0] == "no-proposal":
                return constructed(ModelReply, usage=usage)
            raise_named(reply[1])
        if reply is None:
            reply = {"kind": "final", "answer": "done"}
        return constructed(ModelReply, proposal=reply, usage=usage)


def agent_for(case: Case) -> Agent:
    def output(i: int) -> Any:
        value = case.outputs[i % len(case.outputs)]
        if isinstance(value, tuple):
            raise_named(value[1])
        return value

    @tool
    def produce(i: int = 0) -> Any:
        """Return a drawn output."""
        return output(i)

    def reconcile(key: str) -> Reconciled:
        if isinstance(case.receipt, tuple):
            if case.receipt[0] == "constructed":
                _, status, reason, receipt = case.receipt
                return constructed(Reconciled, status=status, reason=reason, receipt=receipt)
            raise_named(case.receipt[1])
        return Reconciled(status="committed", receipt=case.receipt)

    @tool(effect="write", reconcile=reconcile)
    def pay(i: int = 0) -> Any:
        """A write whose reply is lost half the time."""
        if i % 2:
            raise ConnectionError("reply lost")
        return output(i)

    return Agent(
        "fuzzed",
        DrawnModel(case),
        [produce, pay],
        Budget(max_steps=5),
        max_invalid_proposals=2,
        policy=lambda request: case.verdict,
    )


async def run_case(db_url: str, case: Case) -> str:
    """Run one case; check its outcome is typed and everything of it reads back."""
    invocation_id = uuid4().hex
    with trio.fail_after(60):
        async with Runtime(db_url, follow_projections=True) as runtime:
            outcome = await runtime.run(
                agent_for(case), "fuzz \x1b[2J", invocation_id=invocation_id
            )
            assert isinstance(outcome.reason, TerminalReason)
            await runtime.load(invocation_id)
            await runtime.history(invocation_id)
            if outcome.reason is TerminalReason.RECONCILIATION_REQUIRED:
                again = await runtime.resume(invocation_id, agent_for(case))
                assert isinstance(again.reason, TerminalReason)
    store = EventStore(db_url, create=False)
    try:
        store.events(invocation_id)
        assert all(report.intact for report in verify_invocation(store, invocation_id))
    finally:
        store.close()
    return invocation_id


def fuzz(db_url: str, examples: int) -> list[str]:
    """Run ``examples`` drawn cases on ``db_url``; return the invocation ids."""
    ids: list[str] = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(CASES)
    def one(case: Case) -> None:
        ids.append(trio.run(run_case, db_url, case))

    one()
    return ids


def check_cli(db_url: str, ids: list[str], cwd: Path, *, sample: int | None = None) -> None:
    """history and show of each invocation (or a sample), list, metrics, audit verify."""
    chosen = ids if sample is None else ids[:: max(1, len(ids) // sample)]
    commands = [["history", i] for i in chosen] + [["show", i] for i in chosen]
    commands += [["list", "--limit", "1000"], ["metrics"], ["metrics", "--by", "agent"]]
    commands += [["audit", "verify"], ["effects"]]
    for start in range(0, len(commands), 8):  # eight at a time
        running = [
            (
                command,
                subprocess.Popen(
                    [*CLI, *command, "--db", db_url],
                    cwd=cwd,
                    env=cli_env(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    errors="backslashreplace",
                ),
            )
            for command in commands[start : start + 8]
        ]
        for command, process in running:
            stdout, stderr = process.communicate(timeout=300)
            assert process.returncode == 0, (command, stderr[-2000:])
            assert "Traceback" not in stderr, (command, stderr[-2000:])
            assert "\x1b" not in stdout, command


def test_fuzzed_replies_outputs_receipts_and_usage_never_break_a_run_or_a_read(
    tmp_path: Path,
) -> None:
    """50 drawn runs on one SQLite file, then the CLI over all of it (see the module)."""
    db_url = f"sqlite:///{tmp_path / 'fuzz.db'}"
    ids = fuzz(db_url, examples=50)
    assert len(ids) >= 50
    check_cli(db_url, ids, tmp_path, sample=10)
