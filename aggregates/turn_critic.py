"""The turn core's rules for a critic (reflection), with no I/O: a part of :class:`TurnCore`.

Reuses the verification gate: a final answer that passed the agent's verifier (or
every final answer, without one) is *answered*: with a critic it is committed, then
reviewed (:class:`~aggregates.turn_messages.Critique`); without one the run completes.
The verdict (``CritiqueReturned``) is committed before the loop moves on, so a run that
dies between the answer and the verdict asks the critic again (nothing external was
written), and one that dies after it follows the committed verdict. The vocabulary and
the pure checks are in :mod:`aggregates.critic`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, assert_never

from aggregates.critic import (
    CriticSettings,
    MalformedVerdict,
    Revise,
    Verdict,
    not_asked_because,
    read_verdict,
    revision_notice,
)
from aggregates.decisions import Final, TerminalReason, Usage
from aggregates.invocation import Phase
from aggregates.revalidation import admitted_usage
from aggregates.turn_messages import (
    Action,
    Continue,
    Critique,
    Finished,
    ModelAnswered,
    ModelFailed,
    ModelInterrupted,
    ModelObservation,
    ModelQuotaWait,
    ModelTimedOut,
    Moment,
)
from aggregates.values import safe_text, usage_problem

if TYPE_CHECKING:
    from aggregates.call_secrets import CallSecrets
    from aggregates.children import Spent
    from aggregates.invocation import Invocation
    from aggregates.settings import RunSettings


class CriticRounds:
    """The critic's part of the turn core (mixed into :class:`aggregates.turn.TurnCore`)."""

    invocation: Invocation
    settings: RunSettings
    critiques: bool
    """Whether the shell has a critic (a model, which the record cannot hold)."""
    _call_secrets: CallSecrets

    # What the core gives this part (defined by TurnCore).
    def _end(
        self,
        reason: TerminalReason,
        moment: Moment,
        *,
        answer: str | None = None,
        detail: str | None = None,
    ) -> Finished:  # pragma: no cover - TurnCore's
        raise NotImplementedError

    def _cancelled(self, moment: Moment, what: str) -> Finished:  # pragma: no cover
        raise NotImplementedError

    def _deadline_passed(self, moment: Moment) -> bool:  # pragma: no cover
        raise NotImplementedError

    def _usage_exhausted(
        self, *, reserving: bool
    ) -> tuple[TerminalReason, str] | None:  # pragma: no cover
        raise NotImplementedError

    def _children_used(self) -> Spent:  # pragma: no cover
        raise NotImplementedError

    # ----------------------------------------------------------------- the rules

    def _answered(self, moment: Moment) -> Action:
        """The final answer passed the verifier (or there is none): review it, or complete."""
        inv = self.invocation
        answer = self._final_answer()
        critic = self.settings.critic
        if critic is None:
            return self._end(TerminalReason.COMPLETED, moment, answer=answer)
        if moment.cancel_requested:
            return self._cancelled(moment, "cancel requested")
        stands = self._unreviewed_because(critic, moment)
        if stands is not None:
            return self._end(TerminalReason.COMPLETED, moment, answer=answer, detail=stands)
        return Critique(
            round=inv.critic_spent.rounds + 1,
            step=inv.step,
            answer=answer,
            turns=list(inv.turns),
            instructions=critic.instructions,
        )

    def _unreviewed_because(self, critic: CriticSettings, moment: Moment) -> str | None:
        """Why the critic is not asked (the answer then stands); None: it is asked."""
        if not self.critiques:
            return "not reviewed: the agent that drives this run has no critic"
        spent = not_asked_because(self.invocation.critic_spent, critic)
        if spent is not None:
            return spent
        if self._deadline_passed(moment):
            return "not reviewed: the deadline passed"
        # A revision would be a step of the agent's: none is asked for when it has none.
        children = self._children_used()
        if self.invocation.step + children.steps >= self.invocation.budget.max_steps:
            return "not reviewed: no step is left for a revision"
        exhausted = self._usage_exhausted(reserving=True)
        if exhausted is not None:
            return f"not reviewed: no budget is left for a revision ({exhausted[1]})"
        return None

    def on_critique(self, observation: ModelObservation, moment: Moment) -> Action:
        """The critic's reply (or what became of its call): record the round, then go on.

        ``accept`` completes; ``revise`` sends the answer back to the agent's model; a
        reply that is no verdict and a failed call are spent rounds: the critic is asked
        again while rounds remain, else the answer stands.
        """
        critic = self.settings.critic
        assert critic is not None  # a Critique is only asked for with one
        usage = Usage()
        match observation:
            case ModelInterrupted():
                return self._cancelled(moment, "cancel requested while the critic reviewed")
            case ModelTimedOut():
                return self._end(
                    TerminalReason.COMPLETED,
                    moment,
                    answer=self._final_answer(),
                    detail="not reviewed: the deadline passed while the critic reviewed",
                )
            case ModelQuotaWait(until=until, limit=limit):
                verdict = Verdict.FAILED, f"no quota of {limit} before {until.isoformat()}"
            case ModelFailed(error_type=error_type, message=message):
                verdict = (
                    Verdict.FAILED,
                    self._call_secrets.scrub_all(
                        f"the critic's model raised {error_type}: {message}"
                    ),
                )
            case ModelAnswered(proposal=proposal, usage=reported):
                admitted = _critic_usage(reported, critic)
                if isinstance(admitted, str):
                    verdict = Verdict.FAILED, admitted
                else:
                    usage = admitted
                    verdict = self._verdict_of(proposal)
            case _:
                assert_never(observation)
        kind, text = verdict
        inv = self.invocation
        if kind is Verdict.REVISE:
            inv.record_critique(kind, usage=usage, critique=text, at=moment.at)
            return Continue(after_results=False, after_critique=True)
        problem = None if kind is Verdict.ACCEPT else safe_text(text)
        inv.record_critique(kind, usage=usage, problem=problem, at=moment.at)
        if kind is Verdict.ACCEPT:
            return self._end(TerminalReason.COMPLETED, moment, answer=self._final_answer())
        return self._answered(moment)  # a spent round: asked again, or the answer stands

    def _verdict_of(self, proposal: object) -> tuple[Verdict, str]:
        """The verdict a reply gives, with its critique or its problem (scrubbed)."""
        reply = read_verdict(proposal)
        match reply:
            case MalformedVerdict(problems=problems):
                return Verdict.MALFORMED, self._call_secrets.scrub_all("; ".join(problems))
            case Revise(critique=critique):
                return Verdict.REVISE, safe_text(self._call_secrets.scrub_all(critique))
            case _:
                return Verdict.ACCEPT, ""

    def _revision_notices(self) -> list[str]:
        """After a ``revise`` verdict: the critique, for the agent's next request."""
        inv = self.invocation
        if not inv.critic_spent.rounds or inv.phase is not Phase.READY or not inv.turns:
            return []
        last = inv.turns[-1]
        if last.critique is None or not isinstance(last.decision, Final):
            return []
        return [revision_notice(last.critique)]

    def _final_answer(self) -> str:
        decision = self.invocation.last_decision
        assert isinstance(decision, Final)
        return decision.answer


def _critic_usage(reported: object, critic: CriticSettings) -> Usage | str:
    """The critic's reported usage as recorded (priced by its own price), or its problem."""
    admitted = admitted_usage(reported)
    if isinstance(admitted, str):
        return f"the critic reported a usage that cannot be recorded: {admitted}"
    price = critic.price
    if price is not None and not admitted.cost:
        admitted = admitted.model_copy(update={"cost": price.cost(admitted)})
        problem = usage_problem(admitted)
        if problem is not None:
            return f"the critic's priced usage cannot be recorded: {problem}"
    return admitted
