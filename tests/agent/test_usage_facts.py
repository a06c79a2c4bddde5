"""The adapters record who answered, with which model, why it stopped and what it cached.

Bad inputs tried: a model name with a control character and one of 300 characters (left
out, not stored), a negative cached-token count (left out).
"""

from __future__ import annotations

from typing import Any

from aggregates.invocation import DecisionProposed
from loop_actors import Agent, AnthropicModel, Budget, OpenAIModel, RetryPolicy, Runtime, Usage
from tests.support.fake_providers import anthropic_text, openai_text, serve

FAST = RetryPolicy(max_attempts=2, base_s=0.001, max_delay_s=0.01)


async def usages(model: Any) -> list[Usage]:
    async with Runtime("memory://") as runtime:
        await runtime.run(Agent("facts", model, [], Budget(max_steps=3)), "say", invocation_id="i")
        events = await runtime.history("i")
    return [e.usage for e in events if isinstance(e, DecisionProposed)]


def with_body(reply: Any, **changes: Any) -> Any:
    status, headers, body = reply
    return status, headers, {**body, **changes}


async def test_openai_usage_names_provider_models_finish_reason_and_cached_tokens() -> None:
    reply = openai_text("done")
    usage = dict(reply[2]["usage"], prompt_tokens_details={"cached_tokens": 5})
    with serve([with_body(reply, model="gpt-test-2026-01", usage=usage)]) as provider:
        [recorded] = await usages(
            OpenAIModel("gpt-test", base_url=f"{provider.url}/v1", retry=FAST)
        )
    assert (recorded.provider, recorded.model, recorded.response_model) == (
        "openai",
        "gpt-test",
        "gpt-test-2026-01",
    )
    assert recorded.finish_reason == "stop"
    assert recorded.cache_read_input_tokens == 5
    assert recorded.cache_write_input_tokens is None


async def test_anthropic_usage_names_cache_reads_and_writes() -> None:
    reply = anthropic_text("done")
    usage = dict(reply[2]["usage"], cache_read_input_tokens=30, cache_creation_input_tokens=7)
    with serve([with_body(reply, usage=usage)]) as provider:
        [recorded] = await usages(AnthropicModel("claude-test", base_url=provider.url, retry=FAST))
    assert (recorded.provider, recorded.model, recorded.finish_reason) == (
        "anthropic",
        "claude-test",
        "end_turn",
    )
    assert (recorded.cache_read_input_tokens, recorded.cache_write_input_tokens) == (30, 7)


async def test_a_reply_whose_facts_cannot_be_stored_faithfully_leaves_them_out() -> None:
    reply = openai_text("done")
    usage = dict(reply[2]["usage"], prompt_tokens_details={"cached_tokens": -1})
    for model_name in ("m\x00odel", "m" * 300):
        with serve([with_body(reply, model=model_name, usage=usage)]) as provider:
            [recorded] = await usages(
                OpenAIModel("gpt-test", base_url=f"{provider.url}/v1", retry=FAST)
            )
        assert (recorded.response_model, recorded.cache_read_input_tokens) == (None, None)
        assert recorded.model == "gpt-test"
