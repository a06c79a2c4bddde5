"""Real model adapters: OpenAI-compatible Chat Completions and Anthropic Messages.

Each adapter turns the committed history (a :class:`ModelRequest`) into a
provider request with the official SDK, and the reply into our closed decision
union — provider message blocks never reach the state machine. Both SDKs run on
trio through anyio. Retries are ours (the SDKs' own are turned off) so that every
attempt is counted in the decision's usage: rate limits, overload, 5xx,
timeouts and lost connections are retried with exponential backoff and jitter
(honouring ``Retry-After``) within a retry budget; authentication, bad requests
and context overflow are not. A malformed tool call (arguments that are not a
JSON object, an unknown tool) is sent back to the model once with the problem
(configurable) before the runtime rejects it.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import time
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import urlsplit

from aggregates.decisions import (
    CannotContinue,
    Clarification,
    Final,
    Plan,
    Price,
    RequestApproval,
    ToolCalls,
    ToolResult,
    Usage,
    Wait,
)
from aggregates.invocation import Turn
from aggregates.rate_limits import estimate_tokens
from loop_actors._errors import LoopActorsError, UsageError
from loop_actors._logs import fields, package_logger
from loop_actors._messages import ModelReply, ModelRequest, ToolSchema
from loop_actors.agent.plan_tool import PLAN_INSTRUCTION, as_plan, plan_exchange, plan_schemas
from loop_actors.agent.quota import quota_gate
from loop_actors.agent.replies import lone_call

log = package_logger(__name__)

T = TypeVar("T")


class ProviderErrorClass(StrEnum):
    """The class of a provider failure, kept in ``model_error``'s detail."""

    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    SERVER_ERROR = "server_error"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    AUTHENTICATION = "authentication"
    BAD_REQUEST = "bad_request"
    CONTEXT_OVERFLOW = "context_overflow"
    OTHER = "other"


RETRYABLE = frozenset(
    {
        ProviderErrorClass.RATE_LIMITED,
        ProviderErrorClass.OVERLOADED,
        ProviderErrorClass.SERVER_ERROR,
        ProviderErrorClass.TIMEOUT,
        ProviderErrorClass.CONNECTION,
    }
)


class ModelCallError(LoopActorsError):
    """Raised when a provider call failed for good (not retryable, or out of retries)."""

    def __init__(self, error_class: ProviderErrorClass, message: str, *, attempts: int) -> None:
        super().__init__(f"[{error_class.value}] after {attempts} attempt(s): {message}")
        self.error_class = error_class
        self.attempts = attempts


class RetryPolicy:
    """Exponential backoff with jitter: base * 2^n * U(0.75, 1), capped; ``Retry-After`` wins."""

    def __init__(
        self, *, max_attempts: int = 4, base_s: float = 0.5, max_delay_s: float = 8.0
    ) -> None:
        """Set the retry budget."""
        if max_attempts < 1:
            raise UsageError("max_attempts must be at least 1")
        self.max_attempts = max_attempts
        self.base_s = base_s
        self.max_delay_s = max_delay_s

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """How long to wait after failed attempt number ``attempt`` (1-based)."""
        if retry_after is not None and retry_after > 0:
            return min(retry_after, self.max_delay_s * 8)
        jitter = random.uniform(0.75, 1.0)  # noqa: S311 - jitter, not security
        delay: float = self.base_s * 2 ** (attempt - 1) * jitter
        return min(delay, self.max_delay_s)


def _retry_after(error: Exception) -> float | None:
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        if "retry-after-ms" in headers:
            return float(headers["retry-after-ms"]) / 1000.0
        if "retry-after" in headers:
            return float(headers["retry-after"])
    except (TypeError, ValueError):
        return None
    return None


def _status_class(status: int | None, message: str) -> ProviderErrorClass:
    text = message.lower()
    if status in (401, 403):
        return ProviderErrorClass.AUTHENTICATION
    if status == 429:
        return ProviderErrorClass.RATE_LIMITED
    if status in {529, 503} or "overloaded" in text:
        return ProviderErrorClass.OVERLOADED
    if status in (408,):
        return ProviderErrorClass.TIMEOUT
    if status is not None and status >= 500:
        return ProviderErrorClass.SERVER_ERROR
    if status in (400, 413, 422):
        overflow = ("context_length", "context length", "too long", "maximum context")
        if any(marker in text for marker in overflow):
            return ProviderErrorClass.CONTEXT_OVERFLOW
        return ProviderErrorClass.BAD_REQUEST
    return ProviderErrorClass.OTHER


def classify(error: Exception) -> ProviderErrorClass:
    """The class of an SDK exception (OpenAI or Anthropic), by duck typing."""
    name = type(error).__name__
    if name == "APITimeoutError":
        return ProviderErrorClass.TIMEOUT
    if name == "APIConnectionError":
        return ProviderErrorClass.CONNECTION
    status = getattr(error, "status_code", None)
    return _status_class(status, str(error))


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    quota: tuple[str, str] | None = None,
    tokens: int = 1,
    used_tokens: Callable[[T], int] | None = None,
) -> tuple[T, int]:
    """Run ``call`` under the retry policy; return its result and the attempts it took.

    ``quota``: the ``(provider, model)`` the call goes to. When the runtime has a shared
    rate limit for it (:func:`quota_gate`), each attempt first waits for its quota
    (``tokens`` estimated, corrected by ``used_tokens(reply)``); that wait is no
    attempt and burns no retry. A ``rate_limited`` answer blocks the limit for every
    run and worker (until its ``Retry-After``), and the retry waits for the limit
    instead of backing off on its own.

    Raises:
        ModelCallError: the failure was not retryable, or the budget ran out.
        QuotaWaitError: the limit has no quota for an attempt within its ``max_wait_s``.

    Cancellation: a checkpoint (also while backing off, and while it waits for quota).
    """
    import trio  # noqa: PLC0415 - imported with the first call: importing an agent imports no trio

    gate = quota_gate() if quota is not None else None
    attempt = 0
    while True:
        reservation = await gate.acquire(*quota, tokens) if gate and quota else None
        attempt += 1
        try:
            result = await call()
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except Exception as error:
            error_class = classify(error)
            limited = error_class is ProviderErrorClass.RATE_LIMITED
            if gate is not None and reservation is not None and limited:
                await gate.throttled(reservation, _retry_after(error))
            if error_class not in RETRYABLE or attempt >= policy.max_attempts:
                raise ModelCallError(error_class, str(error), attempts=attempt) from error
            if reservation is None or not limited:  # else the limit says when to try again
                delay = policy.delay(attempt, _retry_after(error))
                # The class only: a provider's message may quote the request.
                log.info(
                    "the model call failed (%s, %s, attempt %d of %d); retried in %.3g s",
                    error_class.value,
                    type(error).__name__,
                    attempt,
                    policy.max_attempts,
                    delay,
                    extra=fields(outcome=error_class, error_type=type(error).__name__),
                )
                await trio.sleep(delay)
        else:
            if gate is not None and reservation is not None and used_tokens is not None:
                await gate.settle(reservation, used_tokens(result))
            return result, attempt


def _result_text(result: ToolResult) -> str:
    if result.error is None:
        return json.dumps(result.output)
    return json.dumps(
        {
            "error": {
                "class": result.error.error_class.value,
                "retryable": result.error.retryable,
                "message": result.error.message,
            }
        }
    )


def text_exchange(turn: Turn) -> list[dict[str, Any]]:
    """A turn without tool calls as plain text messages (the same for both providers).

    A refused answer is followed by the verifier's evidence, a question by the
    person's reply; an approval decision reaches the model with the next turn's results.
    """
    messages: list[dict[str, Any]] = []
    match turn.decision:
        case Final(answer=answer):
            messages.append({"role": "assistant", "content": answer})
            if turn.verification:
                evidence = f"That answer was not accepted: {turn.verification}"
                messages.append({"role": "user", "content": evidence})
            if turn.critique:
                critique = f"A critic asks you to revise that answer: {turn.critique}"
                messages.append({"role": "user", "content": critique})
        case Clarification(question=question):
            messages.append({"role": "assistant", "content": question})
            if turn.reply:
                messages.append({"role": "user", "content": turn.reply})
        case Wait(reason=reason, until=until):
            messages.append(
                {"role": "assistant", "content": f"I wait until {until.isoformat()}: {reason}"}
            )
            if turn.reply:
                messages.append({"role": "user", "content": f"You {turn.reply}."})
        case RequestApproval(summary=summary):
            if turn.approval:
                messages.append({"role": "assistant", "content": summary or "approval?"})
                messages.append({"role": "user", "content": turn.approval})
        case None if turn.rejection is not None:
            rejection = turn.rejection
            messages.append({"role": "assistant", "content": json.dumps(rejection.raw)[:2000]})
            messages.append(
                {
                    "role": "user",
                    "content": f"That reply was refused ({rejection.rejection_class.value}): "
                    + "; ".join(rejection.problems)
                    + ". Propose again.",
                }
            )
        case _:
            pass
    return messages


def review_request(request: ModelRequest) -> list[dict[str, Any]]:
    """For a critic: the last message, which asks it for its verdict on the answer."""
    if request.review is None:
        return []
    return [
        {
            "role": "user",
            "content": f"The final answer to review:\n{request.review}\n\n"
            "Reply with your verdict as one JSON object.",
        }
    ]


def system_prompt(request: ModelRequest) -> str:
    """The instructions every adapter sends (the goal goes as the first user message)."""
    if request.review is not None:  # a critic: its instructions are its notices
        return "\n".join(
            [
                f"You review the work of the agent {request.agent_name!r} on the user's goal.",
                *request.notices,
            ]
        )
    lines = [
        f"You are the agent {request.agent_name!r}. Work towards the user's goal.",
        "Call tools when you need facts or actions; several independent calls may go in "
        "one turn. When you are done, answer in plain text. If you cannot go on, say why.",
    ]
    origin = request.handed_off_from
    if origin is not None:
        lines.append(f"You take over from the agent {origin.source_agent!r}: {origin.reason}")
        if origin.seed:
            lines.append(f"What you are told of its work:\n{origin.seed}")
    if request.handoffs:
        lines.append(
            "You may hand the conversation to another agent instead of answering: call "
            + ", ".join(handoff_tool_name(name) for name in request.handoffs)
            + " (alone in its turn) with the reason, and a summary of what it should know."
        )
    lines.extend(request.notices)
    if request.planning:
        lines.append(PLAN_INSTRUCTION)
    return "\n".join(lines)


HANDOFF_PREFIX = "transfer_to_"
"""The tools a model hands off with: ``transfer_to_<agent>`` (reason, summary)."""

HANDOFF_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "description": "why this agent should take over"},
        "summary": {"type": "string", "description": "what it should know"},
    },
    "required": ["reason"],
}


def handoff_tool_name(agent_name: str) -> str:
    """The tool a model calls to hand off to ``agent_name``."""
    return HANDOFF_PREFIX + "".join(c if c.isalnum() or c in "_-" else "_" for c in agent_name)


def handoff_schemas(request: ModelRequest) -> list[ToolSchema]:
    """The handoff tools of a request, as tools a provider shows its model."""
    return [
        ToolSchema(
            name=handoff_tool_name(name),
            description=f"Hand the conversation over to the agent {name!r}.",
            parameters=HANDOFF_PARAMETERS,
        )
        for name in request.handoffs
    ]


def as_handoff(proposal: Any, request: ModelRequest) -> Any:
    """A proposal of one call of a handoff tool, as the ``handoff`` decision it means.

    Any other proposal as it is (a handoff call among others is an unknown tool: the
    core rejects it, and the model is told).
    """
    called = lone_call(proposal) if request.handoffs else None
    if called is None:
        return proposal
    name, arguments = called
    to = {handoff_tool_name(n): n for n in request.handoffs}.get(name)
    if to is None:
        return proposal
    return {
        "kind": "handoff",
        "to": to,
        "reason": arguments.get("reason", ""),
        "summary": arguments.get("summary"),
    }


def malformed_calls(calls: list[tuple[str, str, str]], tools: set[str]) -> list[tuple[str, str]]:
    """Problems in (id, name, arguments JSON) calls: unknown tools, arguments not a JSON object."""
    problems = []
    for call_id, name, arguments in calls:
        if name not in tools:
            problems.append((call_id, f"unknown tool {name!r}; the tools are {sorted(tools)}"))
            continue
        try:
            parsed = json.loads(arguments or "{}")
        except ValueError as error:
            problems.append((call_id, f"arguments are not valid JSON: {error}"))
            continue
        if not isinstance(parsed, dict):
            problems.append((call_id, "arguments must be a JSON object"))
    return problems


class _Adapter:
    provider: str

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        retry: RetryPolicy | None = None,
        reprompt_malformed: int = 1,
        price: Price | None = None,
        timeout_s: float = 120.0,
        send_key_to_loopback: bool = False,
    ) -> None:
        if not model:
            raise UsageError(f"{self.provider}: a model name is needed")
        self._sdk()  # before any run is recorded: a missing SDK is the caller's to fix
        self.model = model
        self.base_url = base_url
        self.api_key = api_key
        self.send_key_to_loopback = send_key_to_loopback
        self.retry = retry or RetryPolicy()
        if reprompt_malformed < 0:
            raise UsageError("reprompt_malformed must be >= 0")
        self.reprompt_malformed = reprompt_malformed
        self.price = price
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, base_url={self.base_url!r})"

    def _sdk(self) -> Any:
        """The provider's SDK module.

        Raises:
            UsageError: it is not installed (with the extra to install).
        """
        try:
            return importlib.import_module(self.provider)
        except ImportError as error:
            raise UsageError(
                f"the {self.provider} SDK is not installed: pip install "
                f"'loop-actors[{self.provider}]' to use {self.provider}: models"
            ) from error

    def _key(self, variable: str) -> str | None:
        """The API key: given, else the provider's variable, except for a server on this machine.

        A key from the environment is not sent to a loopback ``base_url`` (a local
        vLLM or Ollama needs none, and should not see it), unless
        ``send_key_to_loopback`` (a local gateway that forwards it).
        """
        if self.api_key:
            return self.api_key
        if self.base_url and _is_loopback(self.base_url) and not self.send_key_to_loopback:
            return "not-needed"
        return os.environ.get(variable) or ("not-needed" if self.base_url else None)

    def check_key(self) -> None:
        """Fail early, with the variable to set, when no key can be found.

        Raises:
            UsageError: no key.
        """
        variable = "OPENAI_API_KEY" if self.provider == "openai" else "ANTHROPIC_API_KEY"
        if self._key(variable) is None:
            raise UsageError(
                f"set {variable} (or give api_key) to use {self.provider}:{self.model}"
            )

    def _usage(self, input_tokens: int, output_tokens: int, started: float, attempts: int) -> Usage:
        usage = Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            attempts=attempts,
        )
        if self.price is not None:
            usage = usage.model_copy(update={"cost": self.price.cost(usage)})
        return usage

    def messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The provider's messages for a request's history."""
        raise NotImplementedError

    def tools(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The tools, in the provider's format."""
        raise NotImplementedError

    def _client(self) -> Any:
        """The provider's async client (an async context manager), its own retries off."""
        raise NotImplementedError

    async def _create(
        self, client: Any, request: ModelRequest, messages: list[dict[str, Any]], tools: list[Any]
    ) -> Any:
        """One provider request (one attempt): the SDK's reply, or the SDK's exception."""
        raise NotImplementedError

    def _tokens(self, reply: Any) -> tuple[int, int]:
        """A reply's input and output tokens."""
        raise NotImplementedError

    def _calls(self, reply: Any) -> list[tuple[str, str, str]]:
        """A reply's tool calls as (id, name, arguments JSON)."""
        raise NotImplementedError

    def _reply_facts(self, reply: Any) -> dict[str, Any]:
        """What the reply says of itself, for ``Usage`` (the model, why it stopped, caching)."""
        return {}

    def _reprompt(
        self, reply: Any, calls: list[tuple[str, str, str]], problems: list[tuple[str, str]]
    ) -> list[dict[str, Any]]:
        """The messages that give a malformed batch back to the model, with its problems."""
        raise NotImplementedError

    def _proposal(self, reply: Any, calls: list[tuple[str, str, str]]) -> Any:
        """The decision a reply proposes (checked by the turn core like any proposal)."""
        raise NotImplementedError

    async def decide(self, request: ModelRequest) -> ModelReply:
        """Ask the model; retry what may pass; re-prompt a malformed tool call once.

        Every attempt of every round goes through :func:`call_with_retries` with this
        adapter's :class:`RetryPolicy`, and is counted in the decision's usage.

        Raises:
            ModelCallError: the provider failed for good.

        Cancellation: a checkpoint; nothing is recorded for a cancelled call.
        """
        started = time.perf_counter()
        messages = self.messages(request)
        tools = self.tools(request)
        names = {
            tool_.name
            for tool_ in [*request.tools, *handoff_schemas(request), *plan_schemas(request)]
        }
        tokens_in = tokens_out = attempts = 0
        async with self._client() as client:
            for round_ in range(self.reprompt_malformed + 1):

                async def create(messages: list[dict[str, Any]] = messages) -> Any:
                    return await self._create(client, request, messages, tools)

                reply, tries = await call_with_retries(
                    create,
                    self.retry,
                    quota=(self.provider, self.model),
                    tokens=estimate_tokens(len(json.dumps([messages, tools], default=str))),
                    used_tokens=lambda reply: sum(self._tokens(reply)),
                )
                attempts += tries
                used_in, used_out = self._tokens(reply)
                tokens_in += used_in
                tokens_out += used_out
                calls = self._calls(reply)
                problems = malformed_calls(calls, names)
                if problems and round_ < self.reprompt_malformed:
                    messages = [*messages, *self._reprompt(reply, calls, problems)]
                    continue
                break
        usage = self._usage(tokens_in, tokens_out, started, attempts)
        usage = usage.model_copy(
            update={"provider": self.provider, "model": self.model, **self._reply_facts(reply)}
        )
        return ModelReply(
            proposal=as_plan(as_handoff(self._proposal(reply, calls), request), request),
            usage=usage,
        )


class OpenAIModel(_Adapter):
    """OpenAI Chat Completions with tools (also vLLM, llama.cpp, Ollama, gateways via ``base_url``).

    The key comes from ``api_key`` or ``$OPENAI_API_KEY``; with a ``base_url`` and
    no key, a placeholder is sent (local servers usually need none). A key from the
    environment is not sent to a ``base_url`` on this machine (loopback) unless
    ``send_key_to_loopback=True``; an ``api_key`` given here always is.

    Raises:
        UsageError: the ``openai`` SDK is not installed (``loop-actors[openai]``).
    """

    provider = "openai"

    def _client(self) -> Any:
        openai = self._sdk()
        key = self._key("OPENAI_API_KEY")
        if key is None:
            raise UsageError("set OPENAI_API_KEY (or give api_key) to use an openai: model")
        return openai.AsyncOpenAI(
            api_key=key, base_url=self.base_url, max_retries=0, timeout=self.timeout_s
        )

    def messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The Chat Completions messages for a request's history."""
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt(request)},
            {"role": "user", "content": request.goal},
        ]
        for turn in request.turns:
            decision = turn.decision
            match decision:
                case ToolCalls(calls=calls):
                    messages.append(
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": call.id,
                                    "type": "function",
                                    "function": {
                                        "name": call.name,
                                        "arguments": json.dumps(call.arguments),
                                    },
                                }
                                for call in calls
                            ],
                        }
                    )
                    messages.extend(
                        {"role": "tool", "tool_call_id": r.call_id, "content": _result_text(r)}
                        for r in turn.results
                    )
                case (
                    Final() | Clarification() | RequestApproval() | CannotContinue() | Wait() | None
                ):
                    messages.extend(text_exchange(turn))
                case Plan():
                    messages.extend(plan_exchange(turn))
        messages.extend(review_request(request))
        return messages

    def tools(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The tools, as JSON Schema from the pydantic models that validate them."""
        return [
            {
                "type": "function",
                "function": {
                    "name": tool_.name,
                    "description": tool_.description,
                    "parameters": tool_.parameters,
                },
            }
            for tool_ in [*request.tools, *handoff_schemas(request), *plan_schemas(request)]
        ]

    async def _create(
        self, client: Any, request: ModelRequest, messages: list[dict[str, Any]], tools: list[Any]
    ) -> Any:
        arguments: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            arguments["tools"] = tools
        return await client.chat.completions.create(**arguments)

    def _tokens(self, reply: Any) -> tuple[int, int]:
        if reply.usage is None:
            return 0, 0
        return reply.usage.prompt_tokens or 0, reply.usage.completion_tokens or 0

    def _reply_facts(self, reply: Any) -> dict[str, Any]:
        choices = getattr(reply, "choices", None) or []
        details = getattr(getattr(reply, "usage", None), "prompt_tokens_details", None)
        return _known(
            response_model=getattr(reply, "model", None),
            finish_reason=getattr(choices[0], "finish_reason", None) if choices else None,
            cache_read_input_tokens=getattr(details, "cached_tokens", None),
        )

    def _calls(self, reply: Any) -> list[tuple[str, str, str]]:
        return [
            (c.id, c.function.name, c.function.arguments or "{}")
            for c in (reply.choices[0].message.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]

    def _reprompt(
        self, reply: Any, calls: list[tuple[str, str, str]], problems: list[tuple[str, str]]
    ) -> list[dict[str, Any]]:
        return [
            reply.choices[0].message.model_dump(exclude_none=True),
            *(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": "This call was malformed: "
                    + dict(problems).get(call_id, "another call of the batch was")
                    + ". Propose the whole batch again.",
                }
                for call_id, _, _ in calls
            ),
        ]

    def _proposal(self, reply: Any, calls: list[tuple[str, str, str]]) -> Any:
        choice = reply.choices[0]
        message = choice.message
        refusal = getattr(message, "refusal", None)
        if refusal:
            return {"kind": "cannot_continue", "reason": f"the model refused: {refusal}"}
        if calls:
            return {
                "kind": "tool_calls",
                "calls": [{"id": i, "name": n, "arguments": a} for i, n, a in calls],
            }
        if message.content and message.content.strip():
            return {"kind": "final", "answer": message.content}
        if choice.finish_reason == "content_filter":
            return {"kind": "cannot_continue", "reason": "the provider filtered the reply"}
        return {"kind": "cannot_continue", "reason": "the model returned an empty reply"}


class AnthropicModel(_Adapter):
    """Anthropic Messages with tools (``tool_use`` / ``tool_result`` correlated by id).

    The key comes from ``api_key`` or ``$ANTHROPIC_API_KEY`` (withheld from a loopback
    ``base_url`` as for :class:`OpenAIModel`).

    Raises:
        UsageError: the ``anthropic`` SDK is not installed (``loop-actors[anthropic]``).
    """

    provider = "anthropic"

    def __init__(self, model: str, *, max_tokens: int = 4096, **options: Any) -> None:
        """``max_tokens`` bounds each reply (Anthropic requires it)."""
        super().__init__(model, **options)
        self.max_tokens = max_tokens

    def _client(self) -> Any:
        anthropic = self._sdk()
        key = self._key("ANTHROPIC_API_KEY")
        if key is None:
            raise UsageError("set ANTHROPIC_API_KEY (or give api_key) to use an anthropic: model")
        return anthropic.AsyncAnthropic(
            api_key=key, base_url=self.base_url, max_retries=0, timeout=self.timeout_s
        )

    def messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The Messages API history."""
        messages: list[dict[str, Any]] = [{"role": "user", "content": request.goal}]
        for turn in request.turns:
            decision = turn.decision
            match decision:
                case ToolCalls(calls=calls):
                    messages.append(
                        {
                            "role": "assistant",
                            "content": [
                                {
                                    "type": "tool_use",
                                    "id": call.id,
                                    "name": call.name,
                                    "input": call.arguments,
                                }
                                for call in calls
                            ],
                        }
                    )
                    messages.append(
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "tool_result",
                                    "tool_use_id": r.call_id,
                                    "content": _result_text(r),
                                    "is_error": r.error is not None,
                                }
                                for r in turn.results
                            ],
                        }
                    )
                case (
                    Final() | Clarification() | RequestApproval() | CannotContinue() | Wait() | None
                ):
                    messages.extend(text_exchange(turn))
                case Plan():
                    messages.extend(plan_exchange(turn))
        messages.extend(review_request(request))
        return messages

    def tools(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The tools, as JSON Schema from the pydantic models that validate them."""
        return [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in [*request.tools, *handoff_schemas(request), *plan_schemas(request)]
        ]

    async def _create(
        self, client: Any, request: ModelRequest, messages: list[dict[str, Any]], tools: list[Any]
    ) -> Any:
        arguments: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": system_prompt(request),
            "messages": messages,
        }
        if tools:
            arguments["tools"] = tools
        return await client.messages.create(**arguments)

    def _tokens(self, reply: Any) -> tuple[int, int]:
        return reply.usage.input_tokens or 0, reply.usage.output_tokens or 0

    def _reply_facts(self, reply: Any) -> dict[str, Any]:
        usage = getattr(reply, "usage", None)
        return _known(
            response_model=getattr(reply, "model", None),
            finish_reason=getattr(reply, "stop_reason", None),
            cache_read_input_tokens=getattr(usage, "cache_read_input_tokens", None),
            cache_write_input_tokens=getattr(usage, "cache_creation_input_tokens", None),
        )

    def _calls(self, reply: Any) -> list[tuple[str, str, str]]:
        return [(b.id, b.name, json.dumps(b.input)) for b in reply.content if b.type == "tool_use"]

    def _reprompt(
        self, reply: Any, calls: list[tuple[str, str, str]], problems: list[tuple[str, str]]
    ) -> list[dict[str, Any]]:
        return [
            {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call_id,
                        "content": "This call was malformed: "
                        f"{dict(problems).get(call_id, 'not run')}. "
                        "Propose the whole batch again.",
                        "is_error": True,
                    }
                    for call_id, _, _ in calls
                ],
            },
        ]

    def _proposal(self, reply: Any, calls: list[tuple[str, str, str]]) -> Any:
        uses = [b for b in reply.content if b.type == "tool_use"]
        text = "".join(b.text for b in reply.content if b.type == "text").strip()
        if reply.stop_reason == "refusal":
            return {"kind": "cannot_continue", "reason": f"the model refused: {text}"}
        if uses:
            return {
                "kind": "tool_calls",
                "calls": [{"id": b.id, "name": b.name, "arguments": b.input} for b in uses],
            }
        if text:
            return {"kind": "final", "answer": text}
        return {"kind": "cannot_continue", "reason": "the model returned an empty reply"}


def model_from_name(
    name: str, *, base_url: str | None = None, send_key_to_loopback: bool = False
) -> OpenAIModel | AnthropicModel:
    """``openai:MODEL`` or ``anthropic:MODEL`` → an adapter (keys from the usual variables).

    ``send_key_to_loopback`` sends the key from the environment to a ``base_url``
    on this machine too (a local gateway that needs it); by default it is withheld.

    Raises:
        UsageError: an unknown provider, a missing model name, the provider's SDK
            not installed, or no key.
    """
    provider, sep, model = name.partition(":")
    if not sep or not model:
        raise UsageError(f"a model is named PROVIDER:MODEL (openai: or anthropic:), got {name!r}")
    adapter: OpenAIModel | AnthropicModel
    match provider:
        case "openai":
            adapter = OpenAIModel(
                model, base_url=base_url, send_key_to_loopback=send_key_to_loopback
            )
        case "anthropic":
            adapter = AnthropicModel(
                model, base_url=base_url, send_key_to_loopback=send_key_to_loopback
            )
        case _:
            raise UsageError(f"unknown model provider {provider!r}: use openai: or anthropic:")
    adapter.check_key()
    return adapter


def _known(**facts: Any) -> dict[str, Any]:
    """The facts a reply reported with the type ``Usage`` records (a fake's others are left)."""
    return {
        name: value
        for name, value in facts.items()
        if (isinstance(value, str) and 0 < len(value) <= 200 and value.isprintable())
        or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    }


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")
