"""The sensitive values a turn core met, by call: kept for the runtime, scrubbed from texts."""

from __future__ import annotations

from typing import Any, Literal

from aggregates.redaction import holds_redacted, redacted_values, scrub, withheld
from aggregates.turn_messages import WITHHELD_WHY, Catalogue, KeptSecret, KeptValues


class CallSecrets:
    """The sensitive values of one invocation's calls that its turn core met.

    The real values of redacted arguments and outputs are handed to the runtime's
    secret store (:meth:`take`); their sensitive texts are remembered, by call, so
    that every text the core stores about a call (a tool's error, a service's reason)
    is scrubbed of them (:meth:`scrub_call`), and any text of the run of all of them
    (:meth:`scrub_all`). ``kept`` looks up the values the secret store already holds.
    """

    def __init__(self, catalogue: Catalogue, kept: KeptValues | None) -> None:
        """Remember nothing yet; ``catalogue`` says what each tool redacts."""
        self._catalogue = catalogue
        self._secrets: list[KeptSecret] = []
        self._kept = kept
        self._redacts = catalogue.redacts
        self._sensitive: dict[tuple[int, str], list[str]] = {}
        """The texts of the sensitive values of each call met so far, by (step, call id)."""
        self._known_arguments: set[tuple[int, str]] = set()
        """Calls whose real arguments this core has seen (its own, or the secret store's)."""
        self._looked_up: set[tuple[int, str]] = set()

    def take(self) -> list[KeptSecret]:
        """Remove and return the real values kept since the last call."""
        secrets, self._secrets = self._secrets, []
        return secrets

    def keep(
        self, step: int, call_id: str, name: str, kind: Literal["arguments", "output"], value: Any
    ) -> None:
        """Hand a real value to the runtime's secret store, and remember its sensitive texts."""
        self._secrets.append(KeptSecret(step=step, call_id=call_id, kind=kind, value=value))
        if kind == "arguments":
            self._known_arguments.add((step, call_id))
        self.learn(step, call_id, self._sensitive_in(name, kind, value))

    def _sensitive_in(
        self, name: str, kind: Literal["arguments", "output"], value: Any
    ) -> list[str]:
        if kind == "arguments" and isinstance(value, dict):
            return redacted_values(value, self._catalogue.redact_arguments(name, value))
        if kind == "output":
            return redacted_values(value, self._catalogue.redact_output(name, value))
        return []

    def learn(self, step: int, call_id: str, values: list[str]) -> None:
        """Remember sensitive texts of a call (to scrub them from what is stored about it)."""
        if values:
            self._sensitive.setdefault((step, call_id), []).extend(values)

    def scrub_call(
        self,
        step: int,
        call_id: str,
        name: str,
        text: str,
        *,
        stored: dict[str, Any] | None = None,
    ) -> str:
        """A text about one call (an error, a service's reason) as it may be stored.

        Scrubbed of the call's sensitive values: those met in this run, and those the
        runtime's secret store holds. When the call's ``stored`` arguments hold a
        redacted value whose real value neither knows, the text is withheld.
        """
        if not self._redacts:
            return text  # no tool declares a sensitive field: nothing to scrub
        key = (step, call_id)
        if self._kept is not None and key not in self._looked_up:
            self._looked_up.add(key)
            arguments = self._kept(step, call_id, "arguments")
            if arguments is not None:
                self._known_arguments.add(key)
                self.learn(step, call_id, self._sensitive_in(name, "arguments", arguments))
            output = self._kept(step, call_id, "output")
            if output is not None:
                self.learn(step, call_id, self._sensitive_in(name, "output", output))
        if stored is not None and key not in self._known_arguments and holds_redacted(stored):
            return withheld(text, WITHHELD_WHY)
        return scrub(text, self._sensitive.get(key, ()))

    def scrub_all(self, text: str) -> str:
        """A text that may quote any value met in this run (a model failure, an evidence)."""
        return scrub(text, [v for values in self._sensitive.values() for v in values])
