"""The EffectReconciler: asks owning services what became of effect keys."""

from __future__ import annotations

import trio

from aggregates.decisions import TerminalReason
from aggregates.turn import EffectAnswered, ReconcileOutcome, ServiceUnreachable
from aggregates.values import check_text, describe_error
from loop_actors._guard import is_cancellation
from loop_actors._messages import ReconcileEffect
from loop_actors.agent.tools import ChildPausedError, Toolbox, ask_service, json_value


async def reconcile_effect(toolbox: Toolbox, message: ReconcileEffect) -> ReconcileOutcome:
    """Ask the tool's ``reconcile(effect_key)``, bounded by the tool's timeout.

    Never raises for a service failure: an exception (any, but trio's cancellation),
    a timeout, a missing ``reconcile`` function, or an answer that cannot be stored
    faithfully (a receipt with NaN, a lone surrogate...) is ``ServiceUnreachable``.

    Cancellation: a checkpoint; re-raises ``trio.Cancelled``.
    """
    tool_ = toolbox.tools.get(message.tool)
    if tool_ is None:
        return ServiceUnreachable(
            effect_key=message.effect_key, error=f"the agent has no tool {message.tool!r} now"
        )
    if tool_.reconcile is None:
        return ServiceUnreachable(
            effect_key=message.effect_key,
            error=f"tool {tool_.name} has no reconcile function: resolve this effect by hand",
        )
    timeout_s = toolbox.timeout_for(tool_.name)
    with trio.move_on_after(timeout_s):
        try:
            answer = await ask_service(tool_, message.effect_key)
        except ChildPausedError as paused:
            # A child waits: for a person (the parent pauses with its pause), or for a
            # service of its own (the parent waits for it as for any service).
            if paused.waits.reason is TerminalReason.RECONCILIATION_REQUIRED:
                return ServiceUnreachable(effect_key=message.effect_key, error=str(paused))
            return paused.waits.model_copy(update={"effect_key": message.effect_key})
        except BaseException as error:  # the service could not be asked: data, not a crash
            if is_cancellation(error):
                raise
            return ServiceUnreachable(effect_key=message.effect_key, error=describe_error(error))
        # An answer that cannot be stored faithfully is no answer: the effect stays open.
        receipt, problem = json_value(answer.receipt)
        if problem is None and answer.reason is not None:
            problem = check_text(answer.reason)
        if problem is not None:
            return ServiceUnreachable(
                effect_key=message.effect_key,
                error=f"its answer cannot be stored faithfully: {problem}",
            )
        return EffectAnswered(
            effect_key=message.effect_key,
            status=answer.status,
            receipt=receipt,
            reason=answer.reason,
        )
    return ServiceUnreachable(
        effect_key=message.effect_key, error=f"reconcile gave no answer within {timeout_s:g} s"
    )


async def run_effect_reconciler(
    inbox: trio.MemoryReceiveChannel[ReconcileEffect],
    outbox: trio.MemorySendChannel[ReconcileOutcome],
    *,
    toolbox: Toolbox,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer each ``ReconcileEffect`` with ``EffectAnswered`` or ``ServiceUnreachable``.

    The questions are answered at once, each in a task of its own, in the order their
    answers come (each names its effect key): the writes of one batch are independent,
    and asking about a child invocation drives that child to its end, so the children
    of a resumed parent run at once, as they did in their batch.

    Cancellation: returns when cancelled; a question in flight gets no answer.
    """

    async def answer(message: ReconcileEffect) -> None:
        await outbox.send(await reconcile_effect(toolbox, message))

    async with inbox, outbox, trio.open_nursery() as nursery:
        task_status.started()
        async for message in inbox:
            nursery.start_soon(answer, message)
