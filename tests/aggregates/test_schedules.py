"""The rules of schedules (``aggregates.schedules``): pure, times passed in.

Bad inputs tried: ``--every`` of ``0m``, ``5x``, ``1.5m``, ``-1m``, ``m``, an empty one
and one over a year; cron expressions of 4 and 6 fields, an empty one, values out of
range in each field, a step of 0, a range that runs backwards, an unknown name, a
range of three values, one that never runs (Feb 30, Apr 31); time zones that do not
exist, an empty one, a path; a time zone with ``--every``; names with a space, an
``@``, a leading ``-``, 65 characters, the ``eff-`` prefix; an empty goal.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregates.lease import QueueStatus
from aggregates.schedules import (
    CATCH_UP_AT_MOST,
    MISSED_AFTER_S,
    RESUBMIT_AFTER_S,
    CatchUp,
    Cron,
    Decided,
    Every,
    Overlap,
    Schedule,
    ScheduleProblem,
    ScheduleSpecError,
    ScheduleState,
    Timing,
    check_schedule,
    due_times,
    latest_due_at_or_before,
    new_schedule,
    next_due_after,
    parse_cron,
    parse_every,
    parse_timing,
    paused,
    resumed,
    scheduled_invocation_id,
    submitted,
)

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")


def at(zone: ZoneInfo, year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:  # noqa: PLR0917 - a date, field by field
    """The instant of a wall-clock time that exists once in ``zone``."""
    return int(datetime(year, month, day, hour, minute, tzinfo=zone).timestamp())


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:  # noqa: PLR0917 - a date, field by field
    return int(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp())


def dues(timing: Timing, start: int, end: int) -> list[int]:
    """Every due time in ``(start, end]``, in order."""
    found = []
    due = next_due_after(timing, start)
    while due <= end:
        found.append(due)
        due = next_due_after(timing, due)
    return found


def walls(instants: list[int], zone: ZoneInfo) -> list[str]:
    return [datetime.fromtimestamp(i, zone).strftime("%m-%d %H:%M %Z") for i in instants]


# --------------------------------------------------------------------------- --every


@pytest.mark.parametrize(
    ("text", "seconds", "shown"),
    [("30s", 30, "30s"), ("15m", 900, "15m"), ("2h", 7200, "2h"), ("120s", 120, "2m")],
)
def test_every_takes_seconds_minutes_and_hours(text: str, seconds: int, shown: str) -> None:
    every = parse_every(text)

    assert every == Every(seconds=seconds)
    assert every.text == shown


@pytest.mark.parametrize("text", ["0m", "0s", "5x", "1.5m", "-1m", "m", "", "15", "8785h"])
def test_a_bad_every_is_refused_as_a_bad_interval(text: str) -> None:
    with pytest.raises(ScheduleSpecError) as refused:
        parse_every(text)

    assert refused.value.problem is ScheduleProblem.BAD_INTERVAL
    assert "--every" in str(refused.value)


def test_every_is_due_at_the_multiples_of_its_interval_since_the_epoch() -> None:
    fifteen = Every(seconds=900)

    assert next_due_after(fifteen, utc(2025, 1, 6, 10, 7, 23)) == utc(2025, 1, 6, 10, 15)
    assert next_due_after(fifteen, utc(2025, 1, 6, 10, 15)) == utc(2025, 1, 6, 10, 30)
    assert next_due_after(Every(seconds=2), 11.9) == 12


# --------------------------------------------------------------------------- --cron


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("* * * *", "5 fields"),
        ("* * * * * *", "5 fields"),
        ("", "5 fields"),
        ("60 * * * *", "minute 60 is out of range"),
        ("* 24 * * *", "hour 24 is out of range"),
        ("* * 0 * *", "day of month 0 is out of range"),
        ("* * 32 * *", "day of month 32"),
        ("* * * 13 *", "month 13"),
        ("* * * * 8", "day of week 8"),
        ("*/0 * * * *", "step '0'"),
        ("*/x * * * *", "step 'x'"),
        ("5-1 * * * *", "runs backwards"),
        ("x * * * *", "'x' is not a minute"),
        ("* * * * funday", "'funday' is not a day of week"),
        ("1-2-3 * * * *", "'2-3' is not a minute"),
        ("1,,2 * * * *", "'' is not a minute"),
    ],
)
def test_a_malformed_cron_is_refused_saying_what_is_wrong(expression: str, why: str) -> None:
    with pytest.raises(ScheduleSpecError) as refused:
        parse_cron(expression)

    assert refused.value.problem is ScheduleProblem.MALFORMED_CRON
    assert why in str(refused.value)


@pytest.mark.parametrize("expression", ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 30,31 feb *"])
def test_a_cron_that_matches_no_day_is_refused_as_never_due(expression: str) -> None:
    with pytest.raises(ScheduleSpecError) as refused:
        parse_cron(expression)

    assert refused.value.problem is ScheduleProblem.NEVER_DUE


def test_feb_29_is_due_in_leap_years() -> None:
    leap = parse_cron("0 0 29 2 *")

    assert next_due_after(leap, utc(2025, 1, 1)) == utc(2028, 2, 29)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", " Europe/Paris", "../etc/passwd", "/etc"])
def test_an_unknown_time_zone_is_refused(zone: str) -> None:
    with pytest.raises(ScheduleSpecError) as refused:
        parse_cron("0 9 * * *", zone)

    assert refused.value.problem is ScheduleProblem.UNKNOWN_TIME_ZONE


def test_a_time_zone_with_every_is_refused() -> None:
    with pytest.raises(ScheduleSpecError) as refused:
        parse_timing(every="15m", tz="Europe/Paris")

    assert refused.value.problem is ScheduleProblem.TIME_ZONE_WITHOUT_CRON


def test_a_cron_is_read_in_utc_unless_a_zone_is_given() -> None:
    assert parse_timing(cron="0 9 * * *") == Cron(expression="0 9 * * *", time_zone="UTC")
    assert parse_cron("0  9 * *   *", "Europe/Paris").expression == "0 9 * * *"


def test_weekdays_at_nine_in_paris_skip_the_weekend() -> None:
    weekdays = parse_cron("0 9 * * 1-5", "Europe/Paris")
    friday_noon = at(PARIS, 2025, 1, 10, 12)

    assert walls(dues(weekdays, friday_noon, friday_noon + 4 * 86400), PARIS) == [
        "01-13 09:00 CET",
        "01-14 09:00 CET",
    ]


def test_a_due_time_is_strictly_after_the_time_asked_about() -> None:
    nine = parse_cron("0 9 * * *", "Europe/Paris")

    assert next_due_after(nine, at(PARIS, 2025, 1, 10, 9)) == at(PARIS, 2025, 1, 11, 9)
    assert next_due_after(nine, at(PARIS, 2025, 1, 10, 9) - 0.5) == at(PARIS, 2025, 1, 10, 9)


@pytest.mark.parametrize(
    ("named", "numbered"),
    [
        ("0 9 * * mon-fri", "0 9 * * 1-5"),
        ("0 9 * * SUN", "0 9 * * 7"),
        ("0 9 * * 0", "0 9 * * 7"),
        ("0 0 1 jan,Jul *", "0 0 1 1,7 *"),
        ("0 0 1 */6 *", "0 0 1 1,7 *"),
        ("5/20 * * * *", "5,25,45 * * * *"),
        ("10-20/5 * * * *", "10,15,20 * * * *"),
    ],
)
def test_names_steps_and_lists_mean_the_same_values(named: str, numbered: str) -> None:
    start = utc(2025, 1, 1)
    end = start + 40 * 86400

    assert dues(parse_cron(named), start, end) == dues(parse_cron(numbered), start, end)


def test_a_restricted_day_of_month_and_day_of_week_run_on_either() -> None:
    either = parse_cron("0 0 13 * 5")  # the 13th, and every Friday
    both = parse_cron("0 0 */1 * 5")  # a day of month starting with '*': Fridays only

    days = [
        datetime.fromtimestamp(d, UTC).day for d in dues(either, utc(2025, 6, 1), utc(2025, 7, 1))
    ]
    assert days == [6, 13, 20, 27]  # June 13th 2025 is a Friday
    days = [
        datetime.fromtimestamp(d, UTC).day for d in dues(either, utc(2025, 7, 1), utc(2025, 7, 31))
    ]
    assert days == [4, 11, 13, 18, 25]
    fridays = dues(both, utc(2025, 7, 1), utc(2025, 7, 31))
    assert [datetime.fromtimestamp(d, UTC).day for d in fridays] == [4, 11, 18, 25]


# --------------------------------------------------------------------------- DST


def test_paris_spring_forward_runs_a_time_in_the_gap_once_at_the_first_valid_instant() -> None:
    half_two = parse_cron("30 2 * * *", "Europe/Paris")  # 2024-03-31: 02:00 -> 03:00

    assert walls(dues(half_two, at(PARIS, 2024, 3, 30, 12), at(PARIS, 2024, 4, 1, 12)), PARIS) == [
        "03-31 03:00 CEST",
        "04-01 02:30 CEST",
    ]


def test_paris_spring_forward_runs_times_in_the_gap_and_after_it_once_each_instant() -> None:
    around = parse_cron("0,30 2,3 * * *", "Europe/Paris")

    assert walls(dues(around, at(PARIS, 2024, 3, 30, 12), at(PARIS, 2024, 3, 31, 12)), PARIS) == [
        "03-31 03:00 CEST",  # 02:00, 02:30 and 03:00: one run
        "03-31 03:30 CEST",
    ]


def test_paris_fall_back_runs_a_time_of_the_repeated_hour_once() -> None:
    half_two = parse_cron("30 2 * * *", "Europe/Paris")  # 2024-10-27: 03:00 -> 02:00

    found = dues(half_two, at(PARIS, 2024, 10, 26, 12), at(PARIS, 2024, 10, 28, 12))

    assert walls(found, PARIS) == ["10-27 02:30 CEST", "10-28 02:30 CET"]


def test_paris_fall_back_every_quarter_runs_each_wall_time_once() -> None:
    quarters = parse_cron("*/15 2-3 * * *", "Europe/Paris")

    found = dues(quarters, at(PARIS, 2024, 10, 26, 12), at(PARIS, 2024, 10, 27, 12))

    assert walls(found, PARIS) == [
        "10-27 02:00 CEST",
        "10-27 02:15 CEST",
        "10-27 02:30 CEST",
        "10-27 02:45 CEST",
        "10-27 03:00 CET",  # an hour and a quarter after 02:45 CEST: 02:00-02:45 CET ran
        "10-27 03:15 CET",
        "10-27 03:30 CET",
        "10-27 03:45 CET",
    ]


def test_new_york_spring_forward_runs_a_time_in_the_gap_once() -> None:
    half_two = parse_cron("30 2 * * *", "America/New_York")  # 2024-03-10: 02:00 -> 03:00

    found = dues(half_two, at(NEW_YORK, 2024, 3, 9, 12), at(NEW_YORK, 2024, 3, 11, 12))

    assert walls(found, NEW_YORK) == ["03-10 03:00 EDT", "03-11 02:30 EDT"]
    assert found[0] == utc(2024, 3, 10, 7)


def test_new_york_fall_back_runs_a_time_of_the_repeated_hour_once() -> None:
    half_one = parse_cron("30 1 * * *", "America/New_York")  # 2024-11-03: 02:00 -> 01:00

    found = dues(half_one, at(NEW_YORK, 2024, 11, 2, 12), at(NEW_YORK, 2024, 11, 4, 12))

    assert walls(found, NEW_YORK) == ["11-03 01:30 EDT", "11-04 01:30 EST"]
    assert found[0] == utc(2024, 11, 3, 5, 30)


def test_asked_in_the_second_pass_of_the_repeated_hour_the_next_run_is_after_it() -> None:
    half_one = parse_cron("30 1 * * *", "America/New_York")
    second_pass = utc(2024, 11, 3, 6, 15)  # 01:15 EST, after 01:30 EDT ran

    assert next_due_after(half_one, second_pass) == utc(2024, 11, 4, 6, 30)


@pytest.mark.parametrize(("zone", "hour"), [("Europe/Paris", 2), ("America/New_York", 1)])
def test_a_daily_run_in_the_changing_hour_runs_once_every_day_of_a_year(
    zone: str, hour: int
) -> None:
    daily = parse_cron(f"30 {hour} * * *", zone)
    tz = ZoneInfo(zone)

    found = dues(daily, at(tz, 2023, 12, 31, 12), at(tz, 2024, 12, 31, 12))

    local_days = [datetime.fromtimestamp(d, tz).date() for d in found]
    assert local_days == [date(2024, 1, 1) + timedelta(days=n) for n in range(366)]


@given(st.integers(min_value=utc(2020, 1, 1), max_value=utc(2030, 1, 1)))
def test_the_next_due_time_is_later_and_nothing_is_due_between(after: int) -> None:
    quarter = parse_cron("*/15 1-3 * * *", "Europe/Paris")

    since = next_due_after(quarter, after - 10 * 86400)

    due = next_due_after(quarter, after)

    assert due > after
    assert latest_due_at_or_before(quarter, due, since=since) == due
    assert latest_due_at_or_before(quarter, due - 1, since=since) <= after


# --------------------------------------------------------------------------- catch-up

MINUTE = Every(seconds=60)


def test_nothing_is_due_before_the_next_due_time() -> None:
    assert due_times(MINUTE, 600, 599.9, CatchUp.ALL) == ([], 600)


def test_catch_up_all_runs_every_missed_due_time_in_order() -> None:
    assert due_times(MINUTE, 600, 845.0, CatchUp.ALL) == ([600, 660, 720, 780, 840], 900)


def test_catch_up_all_decides_at_most_a_bounded_number_a_check() -> None:
    found, following = due_times(Every(seconds=1), 100, 100 + 10 * CATCH_UP_AT_MOST, CatchUp.ALL)

    assert found == list(range(100, 100 + CATCH_UP_AT_MOST))
    assert following == 100 + CATCH_UP_AT_MOST  # past already: the next check goes on


def test_catch_up_one_runs_the_latest_missed_due_time() -> None:
    assert due_times(MINUTE, 600, 845.0, CatchUp.ONE) == ([840], 900)


def test_catch_up_none_runs_the_latest_only_while_it_is_not_missed() -> None:
    assert due_times(MINUTE, 600, 840 + MISSED_AFTER_S, CatchUp.NONE) == ([840], 900)
    assert due_times(MINUTE, 600, 840 + MISSED_AFTER_S + 1, CatchUp.NONE) == ([], 900)


def test_catch_up_one_of_a_cron_finds_the_latest_far_back() -> None:
    yearly = parse_cron("0 0 1 1 *")

    found, following = due_times(yearly, utc(2020, 1, 1), utc(2024, 6, 1), CatchUp.ONE)

    assert (found, following) == ([utc(2024, 1, 1)], utc(2025, 1, 1))


def test_catch_up_of_a_cron_over_a_long_outage() -> None:
    minutely = parse_cron("* * * * *")

    found, following = due_times(minutely, utc(2024, 1, 1), utc(2024, 7, 1, 0, 0, 30), CatchUp.ONE)

    assert (found, following) == ([utc(2024, 7, 1)], utc(2024, 7, 1, 0, 1))


# --------------------------------------------------------------------------- ids


def test_a_runs_id_names_its_schedule_and_due_time() -> None:
    assert scheduled_invocation_id("report", utc(2025, 1, 6, 8)) == "report@2025-01-06T08:00:00Z"


@pytest.mark.parametrize("name", ["has space", "a@b", "-lead", "x" * 65, "", "eff-x", "a:b"])
def test_a_bad_schedule_name_is_refused(name: str) -> None:
    with pytest.raises(ScheduleSpecError) as refused:
        new_schedule(name, agent_name="a", goal="g", timing=MINUTE, now=0)

    assert refused.value.problem is ScheduleProblem.BAD_NAME


def test_an_empty_goal_is_refused() -> None:
    with pytest.raises(ScheduleSpecError) as refused:
        new_schedule("s", agent_name="a", goal="  ", timing=MINUTE, now=0)

    assert refused.value.problem is ScheduleProblem.MISSING_GOAL


# --------------------------------------------------------------------------- checks


def schedule(
    *, overlap: Overlap = Overlap.SKIP, catch_up: CatchUp = CatchUp.ONE, now: float = 590.0
) -> Schedule:
    row = new_schedule(
        "s", agent_name="a", goal="g", timing=MINUTE, now=now, overlap=overlap, catch_up=catch_up
    )
    assert row.next_due == 600
    return row


def ids(*dues: int) -> list[str]:
    return [scheduled_invocation_id("s", due) for due in dues]


def found(**statuses: QueueStatus) -> dict[str, QueueStatus | None]:
    """Statuses by due time: ``found(t600=...)``."""
    return {scheduled_invocation_id("s", int(k[1:])): v for k, v in statuses.items()}


def test_a_new_schedule_is_active_and_due_at_the_next_due_time() -> None:
    row = schedule()

    assert (row.state, row.overlap, row.catch_up) == (
        ScheduleState.ACTIVE,
        Overlap.SKIP,
        CatchUp.ONE,
    )
    assert row.looked_up() == []


def test_a_check_before_the_due_time_changes_nothing() -> None:
    check = check_schedule(schedule(), now=599.5, found={})

    assert (check.submit, check.changed) == ((), False)


def test_a_due_check_decides_the_run_and_moves_the_schedule_on() -> None:
    check = check_schedule(schedule(), now=600.2, found={})

    assert check.submit == (600,)
    assert check.changed
    row = check.row
    assert (row.next_due, row.last_due, row.runs, row.updated_at) == (660, 600, 1, 600.2)
    assert row.submitting == (Decided(due=600, decided_at=600.2),)
    assert row.looked_up() == ids(600)


def test_a_decided_run_found_in_the_store_is_forgotten() -> None:
    row = check_schedule(schedule(), now=600.2, found={}).row

    check = check_schedule(row, now=601, found=found(t600=QueueStatus.RUNNABLE))

    assert check.row.submitting == ()
    assert check.submit == ()


def test_a_decided_run_is_submitted_again_only_once_it_is_overdue() -> None:
    row = check_schedule(schedule(), now=600.0, found={}).row

    soon = check_schedule(row, now=600 + RESUBMIT_AFTER_S - 1, found={})
    late = check_schedule(row, now=600 + RESUBMIT_AFTER_S, found={})

    assert (soon.submit, soon.changed) == ((), False)
    assert late.submit == (600,)
    assert late.row.submitting == (Decided(due=600, decided_at=600 + RESUBMIT_AFTER_S),)
    assert late.row.runs == 1  # the same run, not another one


def test_submitted_forgets_the_decided_runs_it_names() -> None:
    row = check_schedule(
        schedule(overlap=Overlap.ALLOW, catch_up=CatchUp.ALL), now=665, found={}
    ).row
    assert [run.due for run in row.submitting] == [600, 660]

    after = submitted(row, [600], now=666)

    assert [run.due for run in after.submitting] == [660]
    assert submitted(after, [600], now=667) is after


@pytest.mark.parametrize("status", [QueueStatus.RUNNABLE, QueueStatus.CLAIMED, QueueStatus.PAUSED])
def test_skip_does_not_run_a_due_time_while_the_previous_run_has_not_ended(
    status: QueueStatus,
) -> None:
    row = check_schedule(schedule(), now=600, found={}).row

    check = check_schedule(row, now=660, found=found(t600=status))

    assert (check.submit, check.skipped) == ((), (660,))
    assert (check.row.next_due, check.row.last_due, check.row.skipped) == (720, 600, 1)


def test_skip_runs_the_due_time_once_the_previous_run_ended() -> None:
    row = check_schedule(schedule(), now=600, found={}).row

    check = check_schedule(row, now=660, found=found(t600=QueueStatus.ENDED))

    assert (check.submit, check.skipped) == ((660,), ())


def test_skip_with_catch_up_all_runs_the_first_missed_and_skips_the_others() -> None:
    check = check_schedule(schedule(catch_up=CatchUp.ALL), now=725, found={})

    assert (check.submit, check.skipped) == ((600,), (660, 720))


def test_queue_submits_a_due_time_once_the_previous_run_ended_one_at_a_time() -> None:
    row = check_schedule(schedule(overlap=Overlap.QUEUE), now=600, found={}).row
    running = found(t600=QueueStatus.CLAIMED)

    row = check_schedule(row, now=660, found=running).row
    check = check_schedule(row, now=720, found=running)
    assert (check.submit, check.row.waiting) == ((), (660, 720))
    row = check.row

    check = check_schedule(row, now=730, found=found(t600=QueueStatus.ENDED))
    assert (check.submit, check.row.waiting, check.row.last_due) == ((660,), (720,), 660)
    row = check.row
    check = check_schedule(row, now=731, found=found(t600=QueueStatus.ENDED))
    assert check.submit == ()  # 660 is decided, not found yet: it has not ended
    check = check_schedule(row, now=732, found=found(t660=QueueStatus.ENDED))
    assert (check.submit, check.row.waiting) == ((720,), ())


def test_allow_submits_every_due_time_while_the_previous_runs() -> None:
    row = check_schedule(schedule(overlap=Overlap.ALLOW), now=600, found={}).row

    check = check_schedule(row, now=660, found=found(t600=QueueStatus.CLAIMED))

    assert check.submit == (660,)
    assert [run.due for run in check.row.submitting] == [660]


def test_a_previous_run_not_in_the_store_does_not_hold_the_next_back() -> None:
    row = check_schedule(schedule(), now=600, found={}).row
    row = check_schedule(row, now=601, found=found(t600=QueueStatus.ENDED)).row

    check = check_schedule(row, now=660, found={})

    assert check.submit == (660,)


def test_a_paused_schedule_runs_nothing_and_resumed_runs_from_the_next_due_time() -> None:
    row = paused(schedule(), now=595)
    assert row.state is ScheduleState.PAUSED
    assert paused(row, now=596) is row

    assert check_schedule(row, now=900, found={}).submit == ()
    again = resumed(row, now=905)
    assert (again.state, again.next_due) == (ScheduleState.ACTIVE, 960)
    assert resumed(again, now=1000) is again  # active: its next due time is kept


def test_a_paused_schedule_still_submits_a_run_decided_before_it_paused() -> None:
    row = paused(check_schedule(schedule(), now=600, found={}).row, now=601)

    check = check_schedule(row, now=600 + RESUBMIT_AFTER_S, found={})

    assert check.submit == (600,)


def test_every_minute_for_five_minutes_with_a_worker_killed_submits_five_runs_once_each() -> None:
    """Workers that check in turn, one dying after a check before submitting, miss nothing.

    The store is a dict of submitted ids; a submission of an id already there adds
    nothing (as the runtime's ``submit_many`` does).
    """
    store: dict[str, QueueStatus | None] = {}
    row = schedule(overlap=Overlap.ALLOW)
    submissions = 0
    for now in range(590, 600 + 5 * 60, 7):  # a check every 7 s, by one worker or another
        check = check_schedule(row, now=now, found={i: store.get(i) for i in row.looked_up()})
        row = check.row
        if now == 660:  # the worker that decided 660 dies before it submits it
            assert check.submit == (660,)
            continue
        for due in check.submit:
            submissions += 1
            store.setdefault(row.invocation_id(due), QueueStatus.ENDED)
        row = submitted(row, check.submit, now=now)

    assert sorted(store) == ids(600, 660, 720, 780, 840)
    assert submissions == 5
