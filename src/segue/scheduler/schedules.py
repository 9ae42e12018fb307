"""Schedules' pure decisions: cron slots, catch-up, and what a slot does while the
previous slot's run still runs (see ``docs/schedules.md``).

No I/O: everything here takes the store's time (``Store.now()``, epoch seconds) and
rows as arguments. The firing loop (:mod:`segue.run.schedules`) applies these
decisions, and the store (``Store.fire_slot``) fences them, so of several agents
exactly one fires each slot.

A *slot* is an instant at which the cron expression matches, in the schedule's time
zone, as epoch seconds (UTC). Cron expressions are parsed and walked by ``cronsim``
(five fields; Debian cron's rules across daylight-saving changes: a job at a fixed
time that falls in the skipped hour runs once just after the change, one in the
repeated hour runs once).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import UsageError
from ..states import RunState

CATCH_UP = ("none", "latest", "all")
OVERLAP = ("skip", "queue", "cancel")
# catch-up "none": a slot fires only while the store's clock is this close past it
# (an agent that was down, or busy, for longer leaves the slot unfired).
GRACE_S = 300.0
# catch-up "all": at most this many slots of one schedule are fired per tick (the rest
# follow at the next ticks), so a long outage of an every-minute job does not stall a tick.
MAX_SLOTS_PER_TICK = 100
FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,47}")
# A run's id is the schedule's name and its slot: NAME-YYYYMMDDTHHMMZ (at most 64 characters).
_SLOT_FORMAT = "%Y%m%dT%H%MZ"


class Action(StrEnum):
    """What a due slot does, given the previous slot's run (``overlap``)."""

    FIRE = "fire"  # create the slot's run and start it
    SKIP = "skip"  # record the slot as skipped (an event on the run still going); do not fire
    WAIT = "wait"  # leave the slot due: it fires once the previous run has finished
    CANCEL = "cancel"  # cancel the previous run, then fire


def check_name(name: str) -> str:
    """A schedule's name becomes the prefix of its runs' ids."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise UsageError(f"schedule name {name!r} is invalid; use 1-48 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return name


def check_cron(expr: str) -> str:
    """The expression, its fields separated by single spaces; UsageError naming the bad field."""
    from cronsim import CronSim, CronSimError

    parts = expr.split() if isinstance(expr, str) else []
    if len(parts) != 5:
        raise UsageError(f"cron {expr!r} must have 5 fields ({' '.join(FIELDS)}), not {len(parts)}; "
                         "e.g. \"0 2 * * *\" for 02:00 every day")
    norm = " ".join(parts)
    try:
        CronSim(norm, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        msg = str(exc)
        for i, field in enumerate(FIELDS):
            if msg == f"Bad {field}":
                raise UsageError(f"cron {expr!r}: its {field} field {parts[i]!r} is invalid") from None
        raise UsageError(f"cron {expr!r} is invalid: {msg}") from None
    return norm


def check_tz(tz: str) -> ZoneInfo:
    """The IANA time zone named ``tz`` (``UTC``, ``Europe/Berlin``); UsageError if unknown."""
    try:
        if not isinstance(tz, str) or not tz or tz.startswith(("/", ".")) or ".." in tz:
            raise ValueError(tz)
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise UsageError(f"unknown time zone {tz!r}; use an IANA name such as UTC or Europe/Berlin") from None


def check_choice(value: str, choices: tuple[str, ...], what: str) -> str:
    if value not in choices:
        raise UsageError(f"{what} must be one of {', '.join(choices)}, not {value!r}")
    return value


def _at(t: float, tz: str) -> datetime:
    return datetime.fromtimestamp(t, check_tz(tz))


def slots_after(cron: str, tz: str, after: float, *, until: float, limit: int) -> list[float]:
    """The slots in (after, until], oldest first, at most ``limit`` of them."""
    from cronsim import CronSim

    out: list[float] = []
    if limit <= 0 or until <= after:
        return out
    for dt in CronSim(cron, _at(after, tz)):
        t = dt.timestamp()
        if t > until or len(out) >= limit:
            break
        if t > after:  # (cronsim starts after the whole second; ``after`` may have a fraction)
            out.append(t)
    return out


def next_slot(cron: str, tz: str, after: float) -> float:
    """The first slot after ``after``."""
    from cronsim import CronSim

    for dt in CronSim(cron, _at(after, tz)):
        if dt.timestamp() > after:
            return dt.timestamp()
    raise AssertionError("unreachable: a valid cron expression always has a next slot")


def latest_slot(cron: str, tz: str, at: float) -> float:
    """The newest slot at or before ``at``."""
    from cronsim import CronSim

    # cronsim's reverse walk starts before its start: start one second past ``at``.
    start = _at(float(int(at)), tz) + timedelta(seconds=1)
    for dt in CronSim(cron, start, reverse=True):
        if dt.timestamp() <= at:
            return dt.timestamp()
    raise AssertionError("unreachable: a valid cron expression always has an earlier slot")


def due_slots(cron: str, tz: str, *, catch_up: str, after: float, now: float,
              grace_s: float = GRACE_S, limit: int = MAX_SLOTS_PER_TICK) -> list[float]:
    """The slots to fire now, oldest first. ``after``: the last slot fired (or skipped),
    else the schedule's creation (a new schedule never fires slots from before it).

    - ``none``: the newest slot, only while ``now`` is within ``grace_s`` of it;
    - ``latest``: the newest slot missed, however old (older missed ones are dropped);
    - ``all``: every missed slot in order (``limit`` per call).
    """
    check_choice(catch_up, CATCH_UP, "catch-up")
    if now <= after:
        return []
    if catch_up == "all":
        return slots_after(cron, tz, after, until=now, limit=limit)
    newest = latest_slot(cron, tz, now)
    if newest <= after:
        return []
    if catch_up == "none" and now - newest > grace_s:
        return []
    return [newest]


def still_going(state: RunState | None) -> bool:
    """Whether a run counts as not finished for the overlap policy: PENDING, RUNNING,
    PAUSING, and PAUSED (a paused run may be resumed). SUCCEEDED, FAILED and CANCELLED
    runs have finished."""
    return state is not None and state not in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)


def overlap_action(overlap: str, previous: RunState | None) -> Action:
    """What a due slot does while the previous slot's run is in state ``previous``
    (None: there is none, or it is gone)."""
    check_choice(overlap, OVERLAP, "overlap")
    if not still_going(previous):
        return Action.FIRE
    return {"skip": Action.SKIP, "queue": Action.WAIT, "cancel": Action.CANCEL}[overlap]


def slot_run_id(name: str, slot: float) -> str:
    """The slot's run id: deterministic, so every agent names the same run."""
    return f"{name}-{datetime.fromtimestamp(slot, UTC).strftime(_SLOT_FORMAT)}"


def fmt_slot(slot: float, tz: str) -> str:
    """A slot in the schedule's own time zone, for humans: 2026-12-07 02:00 CET."""
    return _at(slot, tz).strftime("%Y-%m-%d %H:%M %Z")

