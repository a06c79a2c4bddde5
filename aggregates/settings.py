"""The settings that change a run's course, recorded when it starts and followed on resume.

An agent's budget is recorded in ``InvocationStarted.budget``; everything else
that decides how a run goes (how many refused answers, how many identical
failures, what tokens cost, how the model's view is compacted, what it is told
when steps run out, which approval rules applied) is a :class:`RunSettings`,
recorded beside it. A resume follows the record, not the agent it is given,
unless the caller says otherwise (``allow_settings_change``), which is recorded
too (``SettingsChanged``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from aggregates.critic import CriticSettings
from aggregates.decisions import Frozen, Price
from aggregates.planning import Planning
from aggregates.values import DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_PROPOSAL_BYTES

MIN_SIZE_LIMIT = 512
"""The smallest size limit a run may set (its truncated stand-ins must fit)."""

DEFAULT_WIND_DOWN_NOTICE = "{steps_left} step(s) left: summarise what you have and stop."


class RunSettings(Frozen):
    """Every recorded setting of a run besides its budget.

    Fields added later must be optional with a default: old records stay valid.
    """

    max_invalid_proposals: Annotated[int, Field(ge=0)] = 2
    """Invalid proposals in a row that go back to the model with their problems; one more
    ends the run ``invalid_decision`` (0: the first one does)."""
    max_verification_attempts: Annotated[int, Field(ge=1)] = 2
    """Refused final answers before ``verification_failed``."""
    max_repeated_failures: Annotated[int, Field(ge=1)] = 3
    """Identical failures in a row (tool, arguments, error class) before ``repeated_failure``."""
    tool_failure_limits: dict[str, Annotated[int, Field(ge=1)]] = {}
    """Per-tool overrides of ``max_repeated_failures``."""
    price: Price | None = None
    """Turns token usage into cost when the model reports none."""
    context_limit: Annotated[int, Field(ge=1)] | None = None
    """The most JSON characters of history in the model's view."""
    keep_recent_turns: Annotated[int, Field(ge=0)] = 4
    wind_down_notice: str = DEFAULT_WIND_DOWN_NOTICE
    approval_rules: dict[str, str] | None = None
    """Tool → its approval rule: ``always``, ``never`` or the rule function's name (code is
    not recorded: a resume with another rule for a recorded tool is refused)."""
    max_output_bytes: Annotated[int, Field(ge=MIN_SIZE_LIMIT)] | None = None
    """The largest tool output or receipt stored whole (JSON bytes); a larger one is stored,
    and shown to the model, as its truncated stand-in (None, in runs recorded before it
    was: ``DEFAULT_MAX_OUTPUT_BYTES``)."""
    max_proposal_bytes: Annotated[int, Field(ge=MIN_SIZE_LIMIT)] | None = None
    """The largest model proposal accepted (JSON bytes); a larger one is rejected
    ``too_large`` and stored as its truncated stand-in (None: ``DEFAULT_MAX_PROPOSAL_BYTES``)."""
    handoffs: dict[str, str] | None = None
    """The agents the model may hand off to, by name → the handoff's history policy
    (``full``, ``summary``, ``none``); None without handoffs (and before they existed)."""
    planning: Planning | None = None
    """For an agent that plans before it writes (``aggregates.planning``): who approves its
    plans; None for one that does not (and before plans existed)."""
    critic: CriticSettings | None = None
    """For an agent with a critic (reflection): its rounds, budget and instructions; None
    without one (and before critics existed)."""

    @property
    def output_limit(self) -> int:
        """``max_output_bytes``, or its default."""
        return self.max_output_bytes or DEFAULT_MAX_OUTPUT_BYTES

    @property
    def proposal_limit(self) -> int:
        """``max_proposal_bytes``, or its default."""
        return self.max_proposal_bytes or DEFAULT_MAX_PROPOSAL_BYTES

    def changed_approval_rules(self, current: RunSettings) -> list[str]:
        """The tools whose approval rule differs in ``current`` (tools in both only)."""
        if self.approval_rules is None or current.approval_rules is None:
            return []
        return sorted(
            name
            for name, rule in self.approval_rules.items()
            if name in current.approval_rules and current.approval_rules[name] != rule
        )

    def failure_limit(self, tool: str) -> int:
        """How many identical failures of ``tool`` in a row end the run."""
        return self.tool_failure_limits.get(tool, self.max_repeated_failures)
