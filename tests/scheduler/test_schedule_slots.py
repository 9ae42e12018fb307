"""Schedules' pure decisions (segue.scheduler.schedules): slots of a cron expression in a
time zone, catch-up after missed slots, the overlap policy, and bad input."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segue.errors import UsageError
from segue.scheduler.schedules import (
    GRACE_S,
    Action,
    check_cron,
    check_name,
    check_tz,
    due_slots,
    latest_slot,
    next_slot,
    overlap_action,
    slot_run_id,
    slots_after,
)
from segue.states import RunState


def ts(*args: int, tz: str = "UTC") -> float:
    return datetime(*args, tzinfo=ZoneInfo(tz)).timestamp()  # type: ignore[misc]


def utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")


NIGHTLY = "0 2 * * *"


def test_nightly_slots_are_each_day_at_two() -> None:
    got = slots_after(NIGHTLY, "UTC", ts(2026, 1, 1, 2, 0), until=ts(2026, 1, 4, 2, 0), limit=10)
    assert [utc(t) for t in got] == ["2026-01-02 02:00", "2026-01-03 02:00", "2026-01-04 02:00"]
    assert next_slot(NIGHTLY, "UTC", ts(2026, 1, 1, 1, 59, 59)) == ts(2026, 1, 1, 2, 0)
    assert next_slot(NIGHTLY, "UTC", ts(2026, 1, 1, 2, 0)) == ts(2026, 1, 2, 2, 0)  # after, not at
    assert latest_slot(NIGHTLY, "UTC", ts(2026, 1, 1, 2, 0)) == ts(2026, 1, 1, 2, 0)  # at counts
    assert latest_slot(NIGHTLY, "UTC", ts(2026, 1, 1, 1, 59, 59)) == ts(2025, 12, 31, 2, 0)


def test_every_minute_fires_each_minute_and_fractions_do_not_matter() -> None:
    start = ts(2026, 5, 1, 10, 0) + 0.25
    got = slots_after("* * * * *", "UTC", start, until=start + 300, limit=100)
    assert got == [ts(2026, 5, 1, 10, m) for m in range(1, 6)]
    assert due_slots("* * * * *", "UTC", catch_up="all", after=got[-1], now=got[-1] + 59.9) == []
    assert due_slots("* * * * *", "UTC", catch_up="none", after=got[-1], now=got[-1] + 60.5) == [got[-1] + 60]


def test_catch_up_none_fires_only_a_slot_just_due() -> None:
    after = ts(2026, 1, 1, 2, 0)  # fired last night; the agents were down since
    now = ts(2026, 1, 4, 2, 0) + 30
    assert due_slots(NIGHTLY, "UTC", catch_up="none", after=after, now=now) == [ts(2026, 1, 4, 2, 0)]
    late = ts(2026, 1, 4, 2, 0) + GRACE_S + 1
    assert due_slots(NIGHTLY, "UTC", catch_up="none", after=after, now=late) == []
    assert due_slots(NIGHTLY, "UTC", catch_up="none", after=after, now=late, grace_s=3600) == [ts(2026, 1, 4, 2, 0)]


def test_catch_up_latest_fires_the_newest_missed_slot_however_old() -> None:
    after = ts(2026, 1, 1, 2, 0)
    now = ts(2026, 1, 4, 14, 0)
    assert due_slots(NIGHTLY, "UTC", catch_up="latest", after=after, now=now) == [ts(2026, 1, 4, 2, 0)]
    # nothing missed: nothing due
    assert due_slots(NIGHTLY, "UTC", catch_up="latest", after=ts(2026, 1, 4, 2, 0), now=now) == []


def test_catch_up_all_fires_every_missed_slot_in_order_a_bounded_number_per_call() -> None:
    after = ts(2026, 1, 1, 2, 0)
    now = ts(2026, 1, 4, 14, 0)
    assert due_slots(NIGHTLY, "UTC", catch_up="all", after=after, now=now) == [
        ts(2026, 1, 2, 2, 0), ts(2026, 1, 3, 2, 0), ts(2026, 1, 4, 2, 0)]
    assert due_slots("* * * * *", "UTC", catch_up="all", after=after, now=after + 3600, limit=7) == [
        after + 60 * i for i in range(1, 8)]


def test_a_new_schedule_fires_nothing_from_before_it() -> None:
    created = ts(2026, 1, 4, 2, 0) + 10  # added ten seconds after tonight's slot
    for mode in ("none", "latest", "all"):
        assert due_slots(NIGHTLY, "UTC", catch_up=mode, after=created, now=created + 5) == []
        assert due_slots(NIGHTLY, "UTC", catch_up=mode, after=created, now=ts(2026, 1, 5, 2, 0)) == [
            ts(2026, 1, 5, 2, 0)]


def test_a_time_zone_moves_the_slots() -> None:
    assert next_slot(NIGHTLY, "Europe/Berlin", ts(2026, 1, 1)) == ts(2026, 1, 1, 1, 0)  # CET = UTC+1
    assert next_slot(NIGHTLY, "Europe/Berlin", ts(2026, 6, 30, 12)) == ts(2026, 7, 1, 0, 0)  # CEST = UTC+2
    assert next_slot(NIGHTLY, "America/New_York", ts(2026, 1, 1)) == ts(2026, 1, 1, 7, 0)


def test_daylight_saving_a_skipped_time_fires_once_and_a_repeated_one_once() -> None:
    berlin = "Europe/Berlin"
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST, so 02:30 never happens that night: the
    # slot fires once, right after the jump (Debian cron's rule), and on the days around.
    spring = slots_after("30 2 * * *", berlin, ts(2026, 3, 28, 12, 0, tz=berlin),
                         until=ts(2026, 3, 30, 12, 0, tz=berlin), limit=10)
    assert [utc(t) for t in spring] == ["2026-03-29 01:00", "2026-03-30 00:30"]
    # 2026-10-25: 03:00 CEST falls back to 02:00 CET, so 02:30 happens twice: one slot.
    autumn = slots_after("30 2 * * *", berlin, ts(2026, 10, 24, 12, 0, tz=berlin),
                         until=ts(2026, 10, 26, 12, 0, tz=berlin), limit=10)
    assert [utc(t) for t in autumn] == ["2026-10-25 00:30", "2026-10-26 01:30"]
    # An interval job keeps its interval in real time through the repeated hour.
    half = slots_after("*/30 * * * *", berlin, ts(2026, 10, 24, 23, 50), until=ts(2026, 10, 25, 2, 0),
                       limit=20)
    assert [b - a for a, b in zip(half, half[1:], strict=False)] == [1800.0] * (len(half) - 1)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["0 2 * * *", "30 2 * * *", "*/15 * * * *", "0 */6 * * 1-5", "5 4 1 * *"]),
       st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
       st.floats(min_value=ts(2025, 1, 1), max_value=ts(2028, 1, 1)),
       st.floats(min_value=0, max_value=10 * 86400))
def test_the_newest_slot_is_the_last_of_the_forward_walk(cron: str, tz: str, after: float, span: float) -> None:
    """Both walks agree, across daylight-saving changes: catch-up "latest" and "all" see the
    same slots, and every slot is strictly after the last one."""
    fwd = slots_after(cron, tz, after, until=after + span, limit=10_000)
    assert fwd == sorted(set(fwd)) and all(after < t <= after + span for t in fwd)
    newest = latest_slot(cron, tz, after + span)
    assert (fwd[-1] == newest) if fwd else newest <= after
    due = due_slots(cron, tz, catch_up="latest", after=after, now=after + span)
    assert due == fwd[-1:]


def test_overlap_policy_against_the_previous_run() -> None:
    for state in (None, RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED):
        assert {overlap_action(p, state) for p in ("skip", "queue", "cancel")} == {Action.FIRE}
    for state in (RunState.PENDING, RunState.RUNNING, RunState.PAUSING, RunState.PAUSED):
        assert overlap_action("skip", state) == Action.SKIP
        assert overlap_action("queue", state) == Action.WAIT
        assert overlap_action("cancel", state) == Action.CANCEL


def test_slot_run_ids_are_deterministic_and_valid_run_ids() -> None:
    from segue.home import check_run_id

    assert slot_run_id("nightly", ts(2026, 12, 7, 2, 0)) == "nightly-20261207T0200Z"
    assert slot_run_id("nightly", ts(2026, 12, 7, 3, 0, tz="Europe/Berlin")) == "nightly-20261207T0200Z"
    check_run_id(slot_run_id("n" * 48, ts(2026, 12, 7)))


@pytest.mark.parametrize(("cron", "message"), [
    ("0 25 * * *", "its hour field '25' is invalid"),
    ("61 2 * * *", "its minute field '61' is invalid"),
    ("0 2 32 * *", "its day-of-month field '32' is invalid"),
    ("0 2 * 13 *", "its month field '13' is invalid"),
    ("0 2 * * funday", "its day-of-week field 'funday' is invalid"),
    ("0 2 * *", "must have 5 fields"),
    ("0 0 2 * * *", "must have 5 fields"),
    ("", "must have 5 fields"),
])
def test_a_bad_cron_names_its_field(cron: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        check_cron(cron)


def test_cron_fields_are_normalized() -> None:
    assert check_cron("  0   2 * *  * ") == "0 2 * * *"
    assert check_cron("0 2 * * mon-fri") == "0 2 * * mon-fri"


def test_bad_names_and_time_zones_are_refused() -> None:
    for name in ("", "-x", "a/b", "a..b", "x" * 49, "ü"):
        with pytest.raises(UsageError, match="schedule name"):
            check_name(name)
    for tz in ("Mars/Base", "", "../etc/passwd", "/etc/localtime"):
        with pytest.raises(UsageError, match="unknown time zone"):
            check_tz(tz)
    assert check_name("nightly.embed_v2-1") == "nightly.embed_v2-1"
