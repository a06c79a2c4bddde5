"""The drives of a history and which process reports each: the pure rules, cell by cell."""

from __future__ import annotations

from datetime import datetime, timedelta

from aggregates.decisions import Clarification, Final, TerminalReason, Usage
from aggregates.invocation import Invocation, InvocationEvent
from loop_actors.telemetry import DriveEnd, drives_of
from loop_actors.telemetry.spans import drives_to_report
from tests.support.invocations import AT, batch, dispatched, new, ok


class Story:
    """An invocation's history written with the aggregate, one second per event."""

    def __init__(self) -> None:
        self.invocation: Invocation = new()
        self.events: list[InvocationEvent] = self.invocation.take_events()

    def at(self) -> datetime:
        return AT + timedelta(seconds=len(self.events))

    def _take(self) -> Story:
        self.events.extend(self.invocation.take_events())
        return self

    def calls(self, *ids: str) -> Story:
        decision = batch(*ids)
        self.invocation.propose(decision, usage=Usage(), at=self.at())
        self._take()
        self.invocation.dispatch(dispatched(decision), [list(ids)], at=self.at())
        return self._take()

    def results(self, *ids: str) -> Story:
        self.invocation.commit_results([ok(i) for i in ids], at=self.at())
        return self._take()

    def lease(self, epoch: int) -> Story:
        self.invocation.acquire_lease(f"w{epoch}", epoch, at=self.at())
        return self._take()

    def pause(self) -> Story:
        self.invocation.propose(Clarification(question="?"), usage=Usage(), at=self.at())
        self._take()
        self.invocation.pause(TerminalReason.CLARIFICATION_REQUIRED, question="?", at=self.at())
        return self._take()

    def answer(self) -> Story:
        self.invocation.provide_clarification("yes", at=self.at())
        return self._take()

    def end(self) -> Story:
        self.invocation.propose(Final(answer="done"), usage=Usage(), at=self.at())
        self._take()
        self.invocation.terminate(TerminalReason.COMPLETED, answer="done", at=self.at())
        return self._take()

    @property
    def version(self) -> int:
        return len(self.events)


def shape(story: Story) -> list[tuple[DriveEnd, list[str]]]:
    return [(d.end, [type(e).__name__ for e in d.events]) for d in drives_of(story.events)]


def test_a_run_without_a_pause_or_takeover_is_one_drive() -> None:
    story = Story().calls("a").results("a").end()
    assert [end for end, _ in shape(story)] == [DriveEnd.ENDED]


def test_a_pause_ends_a_drive_and_the_answer_belongs_to_the_wait() -> None:
    story = Story().pause().answer().calls("a").results("a").end()
    (first, first_events), (second, second_events) = shape(story)
    assert first == DriveEnd.PAUSED
    assert first_events == ["InvocationStarted", "DecisionProposed", "Paused"]
    assert second is DriveEnd.ENDED
    assert "ClarificationProvided" not in second_events
    [_, resumed] = drives_of(story.events)
    assert [type(e).__name__ for e in resumed.answers] == ["ClarificationProvided"]


def test_a_lease_acquired_after_events_of_the_drive_cuts_it_as_lost() -> None:
    story = Story().calls("a").lease(1).results("a").end()
    assert [(end, events[0]) for end, events in shape(story)] == [
        (DriveEnd.LEASE_LOST, "InvocationStarted"),
        (DriveEnd.ENDED, "LeaseAcquired"),
    ]


def test_a_lease_acquired_first_in_a_resumed_drive_cuts_nothing() -> None:
    story = Story().pause().answer().lease(1).calls("a").results("a").end()
    assert [end for end, _ in shape(story)] == [DriveEnd.PAUSED, DriveEnd.ENDED]


def test_a_drive_still_running_is_open() -> None:
    story = Story().calls("a")
    assert [end for end, _ in shape(story)] == [DriveEnd.OPEN]


def test_the_process_that_started_and_ended_a_run_reports_its_one_drive() -> None:
    story = Story().calls("a").results("a").end()
    assert [d.index for d in drives_to_report(story.events, 1)] == [0]


def test_the_taker_reports_the_drive_its_lease_cut_and_its_own() -> None:
    story = Story().calls("a")
    taken_at = story.lease(1).version
    story.results("a").end()
    assert [d.index for d in drives_to_report(story.events, taken_at)] == [0, 1]


def test_the_process_that_lost_its_lease_reports_nothing_of_the_takers() -> None:
    story = Story().calls("a").lease(1).results("a").end()
    assert drives_to_report(story.events, 1) == []


def test_a_resume_after_a_pause_reports_only_the_resumed_drive() -> None:
    story = Story().pause().answer()
    resumed_at = story.version
    story.calls("a").results("a").end()
    assert [d.index for d in drives_to_report(story.events, resumed_at)] == [1]


def test_a_drive_that_stopped_without_a_closing_fact_reports_nothing_yet() -> None:
    story = Story().calls("a")
    assert drives_to_report(story.events, 1) == []
