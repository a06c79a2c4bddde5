"""Which API key an adapter sends, checked on the wire against a local fake provider.

A key from the environment is withheld from a server on this machine (it gets
the placeholder ``not-needed``) unless the user opts in for a local gateway
(``send_key_to_loopback`` / ``--send-key-to-loopback``); a key given to the
adapter is always sent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from loop_actors import Agent, AnthropicModel, Budget, Model, OpenAIModel, Runtime
from tests.support.cli import run_cli
from tests.support.fake_providers import anthropic_text, openai_text, serve

AGENTS = """
from loop_actors import Agent, ScriptedModel

agent = Agent("keys", ScriptedModel([{"kind": "final", "answer": "scripted"}]))
"""


async def _run(model: Model) -> str | None:
    agent = Agent("keys", model, budget=Budget(max_steps=2))
    with trio.fail_after(30):
        outcome = await Runtime("memory://").run(agent, "say something")
    return outcome.answer


@pytest.mark.parametrize("opt_in", [False, True])
async def test_openai_sends_the_environment_key_to_a_loopback_server_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, opt_in: bool
) -> None:
    """Bad input guarded against: a local server that should not see ``OPENAI_API_KEY``."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    with serve([openai_text("hello")]) as provider:
        model = OpenAIModel("m", base_url=f"{provider.url}/v1", send_key_to_loopback=opt_in)
        assert await _run(model) == "hello"
    expected = "Bearer sk-from-env" if opt_in else "Bearer not-needed"
    assert [h["authorization"] for h in provider.request_headers] == [expected]


async def test_anthropic_withholds_the_environment_key_from_a_loopback_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same rule for the Anthropic adapter."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    with serve([anthropic_text("hi"), anthropic_text("hi")]) as provider:
        assert await _run(AnthropicModel("m", base_url=provider.url)) == "hi"
        opted = AnthropicModel("m", base_url=provider.url, send_key_to_loopback=True)
        assert await _run(opted) == "hi"
    sent = [h["authorization"] for h in provider.request_headers]  # this SDK sends a bearer
    assert sent == ["Bearer not-needed", "Bearer sk-ant-env"]


async def test_a_key_given_to_the_adapter_is_sent_to_a_loopback_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An explicit ``api_key`` is the user's choice: it goes to the local server."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    with serve([openai_text("hello")]) as provider:
        assert await _run(OpenAIModel("m", base_url=f"{provider.url}/v1", api_key="sk-given")) == (
            "hello"
        )
    assert provider.request_headers[0]["authorization"] == "Bearer sk-given"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [([], "Bearer not-needed"), (["--send-key-to-loopback"], "Bearer sk-from-env")],
)
def test_cli_send_key_to_loopback_sends_the_environment_key_to_a_local_gateway(
    tmp_path: Path, flags: list[str], expected: str
) -> None:
    """``run --model openai:m --base-url LOCAL`` with and without the opt-in flag."""
    (tmp_path / "agents.py").write_text(AGENTS)
    with serve([openai_text("from the gateway")]) as provider:
        result = run_cli(
            "run", "agents:agent", "--goal", "g", "--model", "openai:m",
            "--base-url", f"{provider.url}/v1", *flags,
            cwd=tmp_path,
            env={"OPENAI_API_KEY": "sk-from-env"},
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == "from the gateway"
    assert [h["authorization"] for h in provider.request_headers] == [expected]


def test_cli_send_key_to_loopback_without_a_model_is_a_usage_error(tmp_path: Path) -> None:
    """Bad input: the flag alone (it only applies to ``--model``)."""
    (tmp_path / "agents.py").write_text(AGENTS)
    result = run_cli("run", "agents:agent", "--goal", "g", "--send-key-to-loopback", cwd=tmp_path)
    assert result.returncode == 2
    assert "go with --model" in result.stderr
    assert not (tmp_path / "loop-actors.db").exists()
