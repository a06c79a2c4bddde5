"""The one retry loop both provider adapters share, against each provider's fake server.

Bad inputs tried: a transient provider error (503 for OpenAI, 529 ``overloaded`` for
Anthropic) before the answer, with a budget of two attempts (a second failure would
end the call), and a transient error in the re-prompt round of a malformed call.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loop_actors import AnthropicModel, ModelRequest, OpenAIModel, RetryPolicy
from loop_actors._messages import ToolSchema
from loop_actors.agent.adapters import ModelCallError, ProviderErrorClass
from tests.support import fake_providers as fake
from tests.support.fake_providers import Reply

TWO_ATTEMPTS = RetryPolicy(max_attempts=2, base_s=0.001, max_delay_s=0.01)

Adapter = OpenAIModel | AnthropicModel


def openai(url: str) -> Adapter:
    return OpenAIModel("gpt-test", base_url=url, retry=TWO_ATTEMPTS)


def anthropic(url: str) -> Adapter:
    return AnthropicModel("claude-test", base_url=url, retry=TWO_ATTEMPTS)


PROVIDERS = [
    pytest.param(openai, fake.openai_error(503, "down"), fake.openai_text("fine"), id="openai"),
    pytest.param(
        anthropic,
        fake.anthropic_error(529, "overloaded_error"),
        fake.anthropic_text("fine"),
        id="anthropic",
    ),
]


def request() -> ModelRequest:
    schema = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
    return ModelRequest(
        invocation_id="i",
        agent_name="adapted",
        goal="look up a",
        step=1,
        turns=[],
        tools=[ToolSchema(name="lookup", description="Look up a key.", parameters=schema)],
    )


def test_both_adapters_decide_with_the_one_shared_loop() -> None:
    assert OpenAIModel.decide is AnthropicModel.decide


@pytest.mark.parametrize(("adapter", "transient", "answer"), PROVIDERS)
async def test_a_transient_error_then_an_answer_is_one_decision_of_two_attempts(
    adapter: Callable[[str], Adapter], transient: Reply, answer: Reply
) -> None:
    with fake.serve([transient, answer]) as provider:
        reply = await adapter(provider.url).decide(request())
    assert reply.proposal == {"kind": "final", "answer": "fine"}
    assert reply.usage.attempts == 2
    assert len(provider.requests) == 2
    assert provider.requests[0] == provider.requests[1]  # the same request, sent again


@pytest.mark.parametrize(("adapter", "transient", "answer"), PROVIDERS)
async def test_a_second_transient_error_exhausts_a_budget_of_two(
    adapter: Callable[[str], Adapter], transient: Reply, answer: Reply
) -> None:
    with (
        fake.serve([transient, transient, answer]) as provider,
        pytest.raises(ModelCallError) as raised,
    ):
        await adapter(provider.url).decide(request())
    assert raised.value.attempts == 2
    assert raised.value.error_class in {
        ProviderErrorClass.SERVER_ERROR,
        ProviderErrorClass.OVERLOADED,
    }
    assert len(provider.requests) == 2


@pytest.mark.parametrize(
    ("adapter", "malformed", "transient", "answer"),
    [
        pytest.param(
            openai,
            fake.openai_tool_calls(("c1", "lookup", "not json")),
            fake.openai_error(503, "down"),
            fake.openai_text("fine"),
            id="openai",
        ),
        pytest.param(
            anthropic,
            fake.anthropic_tool_use(("c1", "nosuchtool", {"key": "a"})),
            fake.anthropic_error(529, "overloaded_error"),
            fake.anthropic_text("fine"),
            id="anthropic",
        ),
    ],
)
async def test_the_re_prompt_round_is_retried_and_counted_too(
    adapter: Callable[[str], Adapter], malformed: Reply, transient: Reply, answer: Reply
) -> None:
    with fake.serve([malformed, transient, answer]) as provider:
        reply = await adapter(provider.url).decide(request())
    assert reply.proposal == {"kind": "final", "answer": "fine"}
    assert reply.usage.attempts == 3
    assert len(provider.requests) == 3
