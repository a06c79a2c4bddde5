"""Model adapters over real HTTP, through the official SDKs, against local servers.

A shared contract (``ModelContract``) is passed by ScriptedModel and by both
adapters; provider-specific tests check the wire format, usage, retries by
error class, the malformed-call re-prompt, refusals and empty replies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from aggregates.invocation import DecisionProposed, ResultsCommitted
from loop_actors import (
    Agent,
    AnthropicModel,
    Budget,
    Critic,
    Model,
    OpenAIModel,
    RetryPolicy,
    Runtime,
    ScriptedModel,
    TerminalReason,
    Verdict,
    tool,
)
from tests.support.fake_providers import (
    Reply,
    anthropic_error,
    anthropic_text,
    anthropic_tool_use,
    openai_error,
    openai_text,
    openai_tool_calls,
    serve,
)

FAST = RetryPolicy(max_attempts=3, base_s=0.001, max_delay_s=0.01)


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look up a key."""
    return {"key": key, "value": key.upper()}


async def run(model: Model, goal: str = "look up a and b") -> tuple[Any, list[Any]]:
    agent = Agent("adapted", model, [lookup], Budget(max_steps=4))
    async with Runtime("memory://") as runtime:
        outcome = await runtime.run(agent, goal, invocation_id="i")
        events = await runtime.history("i")
    return outcome, events


# --------------------------------------------------------------------------- the contract

# Abstract steps: ("calls", [(id, name, {args})]) or ("final", text).
Step = tuple[str, Any]


class ModelContract:
    """What every model (scripted or real) must do for the runtime."""

    def scripted(self, steps: list[Step]) -> AbstractContextManager[Model]:
        raise NotImplementedError

    async def test_a_direct_answer_completes(self) -> None:
        with self.scripted([("final", "all done")]) as model:
            outcome, _ = await run(model)
        assert (outcome.reason, outcome.answer) == (TerminalReason.COMPLETED, "all done")

    async def test_parallel_calls_keep_their_ids_and_order(self) -> None:
        steps: list[Step] = [
            ("calls", [("c-a", "lookup", {"key": "a"}), ("c-b", "lookup", {"key": "b"})]),
            ("final", "A and B"),
        ]
        with self.scripted(steps) as model:
            outcome, events = await run(model)
        assert outcome.reason is TerminalReason.COMPLETED
        (results,) = [e for e in events if isinstance(e, ResultsCommitted)]
        assert [(r.call_id, r.output) for r in results.results] == [
            ("c-a", {"key": "a", "value": "A"}),
            ("c-b", {"key": "b", "value": "B"}),
        ]

    async def test_the_model_sees_the_results_of_its_calls(self) -> None:
        steps: list[Step] = [("calls", [("c1", "lookup", {"key": "z"})]), ("final", "Z")]
        with self.scripted(steps) as model:
            outcome, _ = await run(model)
            assert self.saw_result(model, "c1", "Z")
        assert outcome.answer == "Z"

    def saw_result(self, model: Model, call_id: str, text: str) -> bool:
        return True


class TestScriptedModelContract(ModelContract):
    def scripted(self, steps: list[Step]) -> AbstractContextManager[Model]:
        from contextlib import nullcontext

        script: list[dict[str, Any]] = []
        for kind, value in steps:
            if kind == "final":
                script.append({"kind": "final", "answer": value})
            else:
                script.append(
                    {
                        "kind": "tool_calls",
                        "calls": [{"id": i, "name": n, "arguments": a} for i, n, a in value],
                    }
                )
        return nullcontext(ScriptedModel(script))


class _ServedModel(AbstractContextManager[Model]):
    def __init__(self, replies: list[Reply], make: Any) -> None:
        self.replies = replies
        self.make = make
        self._serve = serve(replies)

    def __enter__(self) -> Model:
        self.provider = self._serve.__enter__()
        model = self.make(self.provider.url)
        model.provider_requests = self.provider.requests
        return model  # type: ignore[no-any-return]

    def __exit__(self, *exc: object) -> None:
        self._serve.__exit__(None, None, None)


class TestOpenAIModelContract(ModelContract):
    def scripted(self, steps: list[Step]) -> AbstractContextManager[Model]:
        replies = [
            openai_text(value)
            if kind == "final"
            else openai_tool_calls(*[(i, n, json.dumps(a)) for i, n, a in value])
            for kind, value in steps
        ]
        return _ServedModel(
            replies, lambda url: OpenAIModel("gpt-test", base_url=f"{url}/v1", retry=FAST)
        )

    def saw_result(self, model: Model, call_id: str, text: str) -> bool:
        last = model.provider_requests[-1]  # type: ignore[attr-defined]
        tool_messages = [m for m in last["messages"] if m["role"] == "tool"]
        return any(m["tool_call_id"] == call_id and text in m["content"] for m in tool_messages)


class TestAnthropicModelContract(ModelContract):
    def scripted(self, steps: list[Step]) -> AbstractContextManager[Model]:
        replies = [
            anthropic_text(value) if kind == "final" else anthropic_tool_use(*value)
            for kind, value in steps
        ]
        return _ServedModel(
            replies, lambda url: AnthropicModel("claude-test", base_url=url, retry=FAST)
        )

    def saw_result(self, model: Model, call_id: str, text: str) -> bool:
        last = model.provider_requests[-1]  # type: ignore[attr-defined]
        blocks = [
            block
            for message in last["messages"]
            if message["role"] == "user" and isinstance(message["content"], list)
            for block in message["content"]
        ]
        return any(b["tool_use_id"] == call_id and text in b["content"] for b in blocks)


# --------------------------------------------------------------------------- OpenAI specifics


@pytest.fixture
def openai_served() -> Iterator[Any]:
    def start(replies: list[Reply], **options: Any) -> Any:
        context = serve(replies)
        provider = context.__enter__()
        contexts.append(context)
        options.setdefault("retry", FAST)
        return provider, OpenAIModel("gpt-test", base_url=f"{provider.url}/v1", **options)

    contexts: list[Any] = []
    yield start
    for context in contexts:
        context.__exit__(None, None, None)


async def test_openai_requests_carry_the_tool_schemas_and_the_history(openai_served: Any) -> None:
    provider, model = openai_served(
        [openai_tool_calls(("c1", "lookup", '{"key": "a"}')), openai_text("A")]
    )
    await run(model)
    first, second = provider.requests
    assert first["model"] == "gpt-test"
    (schema,) = first["tools"]
    assert schema["function"]["name"] == "lookup"
    assert schema["function"]["parameters"]["required"] == ["key"]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert second["messages"][2]["tool_calls"][0]["id"] == "c1"


async def test_openai_usage_is_recorded_with_each_decision(openai_served: Any) -> None:
    _, model = openai_served(
        [
            openai_tool_calls(("c1", "lookup", '{"key": "a"}'), prompt=11, completion=4),
            openai_text("A"),
        ]
    )
    _, events = await run(model)
    usages = [e.usage for e in events if isinstance(e, DecisionProposed)]
    assert [(u.input_tokens, u.output_tokens, u.attempts) for u in usages] == [
        (11, 4, 1),
        (7, 3, 1),
    ]


async def test_a_rate_limit_is_retried_and_every_attempt_counted(openai_served: Any) -> None:
    provider, model = openai_served(
        [openai_error(429, "slow down", {"retry-after-ms": "1"}), openai_text("fine")]
    )
    outcome, events = await run(model)
    assert outcome.reason is TerminalReason.COMPLETED
    assert len(provider.requests) == 2
    (decided,) = [e for e in events if isinstance(e, DecisionProposed)]
    assert decided.usage.attempts == 2


@pytest.mark.parametrize(
    ("status", "message", "error_class"),
    [
        (401, "bad key", "authentication"),
        (400, "This model's maximum context length is 8192 tokens", "context_overflow"),
        (400, "bad request", "bad_request"),
    ],
)
async def test_errors_that_cannot_pass_are_not_retried(
    openai_served: Any, status: int, message: str, error_class: str
) -> None:
    provider, model = openai_served([openai_error(status, message), openai_text("never")])
    outcome, _ = await run(model)
    assert outcome.reason is TerminalReason.MODEL_ERROR
    assert len(provider.requests) == 1
    assert outcome.detail is not None
    assert f"[{error_class}]" in outcome.detail


async def test_exhausted_retries_end_in_model_error_with_the_provider_class(
    openai_served: Any,
) -> None:
    provider, model = openai_served([openai_error(503, "down")] * 3)
    outcome, _ = await run(model)
    assert outcome.reason is TerminalReason.MODEL_ERROR
    assert len(provider.requests) == 3
    assert outcome.detail is not None
    assert "[overloaded] after 3 attempt(s)" in outcome.detail


async def test_malformed_arguments_are_re_prompted_once_with_the_parse_error(
    openai_served: Any,
) -> None:
    provider, model = openai_served(
        [
            openai_tool_calls(("c1", "lookup", '{"key": ')),
            openai_tool_calls(("c2", "lookup", '{"key": "a"}')),
            openai_text("A"),
        ]
    )
    outcome, _ = await run(model)
    assert outcome.reason is TerminalReason.COMPLETED
    reprompt = provider.requests[1]["messages"][-1]
    assert reprompt["role"] == "tool"
    assert "not valid JSON" in reprompt["content"]


async def test_a_call_still_malformed_after_the_re_prompt_is_refused_and_the_model_told_why(
    openai_served: Any,
) -> None:
    """Bad input: an unknown tool twice (the adapter's own re-prompt, then the runtime's)."""
    provider, model = openai_served(
        [
            openai_tool_calls(("c1", "nope", "{}")),
            openai_tool_calls(("c1", "nope", "{}")),
            openai_text("sorry, done"),
        ]
    )
    outcome, events = await run(model)
    assert outcome.reason is TerminalReason.COMPLETED
    decided = [e for e in events if isinstance(e, DecisionProposed)]
    assert decided[0].rejection is not None
    told = provider.requests[2]["messages"][-1]
    assert told["role"] == "user"
    assert told["content"].startswith(
        "That reply was refused (unknown_tool): call c1: unknown tool"
    )


async def test_a_refusal_and_an_empty_reply_are_typed_decisions(openai_served: Any) -> None:
    _, refusing = openai_served([openai_text(None, refusal="I can't help with that")])
    outcome, _ = await run(refusing)
    assert outcome.reason is TerminalReason.CANNOT_CONTINUE
    assert outcome.detail is not None
    assert "refused" in outcome.detail
    _, empty = openai_served([openai_text("")])
    outcome, _ = await run(empty)
    assert outcome.reason is TerminalReason.CANNOT_CONTINUE


# --------------------------------------------------------------------------- Anthropic specifics


async def test_anthropic_tool_results_carry_the_tool_use_ids_and_usage_is_recorded() -> None:
    with serve(
        [anthropic_tool_use(("tu_1", "lookup", {"key": "q"})), anthropic_text("Q")]
    ) as provider:
        model = AnthropicModel("claude-test", base_url=provider.url, retry=FAST)
        outcome, events = await run(model)
    assert outcome.answer == "Q"
    second = provider.requests[1]
    assert second["tools"][0]["input_schema"]["required"] == ["key"]
    result_block = second["messages"][2]["content"][0]
    assert (result_block["type"], result_block["tool_use_id"]) == ("tool_result", "tu_1")
    usages = [e.usage for e in events if isinstance(e, DecisionProposed)]
    assert [(u.input_tokens, u.output_tokens) for u in usages] == [(12, 6), (12, 6)]


async def test_anthropic_overload_is_retried() -> None:
    with serve(
        [anthropic_error(529, "overloaded_error", {"retry-after-ms": "1"}), anthropic_text("ok")]
    ) as provider:
        model = AnthropicModel("claude-test", base_url=provider.url, retry=FAST)
        outcome, _ = await run(model)
    assert outcome.reason is TerminalReason.COMPLETED
    assert len(provider.requests) == 2


# --------------------------------------------------------------------------- CLI


def test_the_cli_runs_an_agent_with_a_model_named_on_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "plain_app.py").write_text(
        "from loop_actors import Agent, ScriptedModel, tool\n"
        "@tool\n"
        "def lookup(key: str) -> str:\n"
        "    'Look up.'\n"
        "    return key.upper()\n"
        "agent = Agent('plain', ScriptedModel([]), [lookup])\n"
    )
    with serve(
        [openai_tool_calls(("c1", "lookup", '{"key": "x"}')), openai_text("X it is")]
    ) as provider:
        env = {k: v for k, v in os.environ.items() if k not in ("LOOP_ACTORS_DB", "OPENAI_API_KEY")}
        result = subprocess.run(
            [
                sys.executable, "-m", "loop_actors.cli.main", "run", "plain_app:agent",
                "--goal", "x", "--model", "openai:local-model",
                "--base-url", f"{provider.url}/v1", "--json",
            ],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["answer"] == "X it is"
    assert provider.requests[0]["model"] == "local-model"


def test_an_unknown_provider_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable, "-m", "loop_actors.cli.main", "run", "loop_actors.cli.demo:demo_agent",
            "--goal", "x", "--model", "mystery:m",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "unknown model provider" in result.stderr


def test_a_key_from_the_environment_is_never_sent_to_a_loopback_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    local = OpenAIModel("m", base_url="http://127.0.0.1:9/v1")
    remote = OpenAIModel("m", base_url="https://gateway.example/v1")
    assert local._key("OPENAI_API_KEY") == "not-needed"
    assert remote._key("OPENAI_API_KEY") == "sk-secret"


def test_a_missing_key_is_a_usage_error_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from loop_actors import UsageError, model_from_name

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(UsageError, match="ANTHROPIC_API_KEY"):
        model_from_name("anthropic:claude-x")


async def test_a_provider_critic_reads_the_answer_and_replies_its_verdict_in_text(
    openai_served: Any,
) -> None:
    """The critic's request has no tools, a critic's system prompt, the answer last."""
    provider, critic_model = openai_served(
        [openai_text('```json\n{"kind": "revise", "critique": "name both"}\n```'),
         openai_text('{"kind": "accept"}')]
    )  # fmt: skip
    agent = Agent(
        "adapted",
        ScriptedModel([{"kind": "final", "answer": "a"}, {"kind": "final", "answer": "a and b"}]),
        critic=Critic(critic_model),
    )
    async with Runtime("memory://") as runtime:
        outcome = await runtime.run(agent, "look up a and b", invocation_id="i")

    assert (outcome.answer, outcome.critic and outcome.critic.verdicts) == (
        "a and b",
        [Verdict.REVISE, Verdict.ACCEPT],
    )
    first = provider.requests[0]
    assert "tools" not in first
    assert first["messages"][0]["content"].startswith("You review the work of the agent")
    assert first["messages"][-1]["content"].startswith("The final answer to review:\na")
    # The second review sees the critique the agent was given, after its first answer.
    shown = [m["content"] for m in provider.requests[1]["messages"]]
    assert "A critic asks you to revise that answer: name both" in shown
