"""The runs page: one page of runs, each summarised on the server.

Only the rows of the page shown are summarised (their tasks and counters, a
few small queries each), so that part costs the same with 10 or 10,000 runs.
The store pages the listing (``list_runs(limit=, offset=)``) and counts the
runs per state and flow with one aggregate query (``run_counts``), so the page
costs about the same with 10 or 10,000 runs.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from ..._procs import controller_alive
from ...client.local import LocalClient
from ...placement.policy import priority_class, priority_name
from ...placement.pricing import UNKNOWN_GPU, Prices
from ...scheduler.views import display_states
from ...states import RunState, TaskState
from ...store.base import RunRecord

PAGE_SIZE = 50
LIVE = (RunState.RUNNING, RunState.PAUSING)


@dataclass(frozen=True)
class Row:
    run_id: str
    state: str  # the stored state (the CSS class)
    shown: str  # what `segue ls` shows, e.g. "WAITING (batch)"
    priority: str
    priority_class: str
    flow: str
    steps_done: int
    steps: int
    fraction: float  # 0..1: succeeded steps plus the running ones' progress
    started: float | None
    duration: float | None
    cost: float | None  # USD
    cost_exact: bool  # False: attempts running now are not counted yet


@dataclass(frozen=True)
class Listing:
    rows: list[Row]
    total: int  # runs matching the filters
    page: int
    pages: int
    states: dict[str, int]  # every run in the store by state (the filter's counts)
    flows: list[str]
    state: str | None
    flow: str | None


def _cost(client: LocalClient, prices: Prices, run_id: str, live: bool) -> tuple[float | None, bool]:
    """Money from the run's counters, which hold every finished attempt. A live run's
    attempts still running are left to its run page, where accounting adds them."""
    stats: dict[str, float] = getattr(client.store, "get_stats", lambda r: {})(run_id)
    held = {k[len("held:"):]: v for k, v in stats.items() if k.startswith("held:") and v}
    if not held and stats.get("device_s"):
        held = {UNKNOWN_GPU: stats["device_s"]}
    return round(prices.cost(held), 4), not live


def _row(client: LocalClient, prices: Prices, r: RunRecord, shown: str, now: float) -> Row:
    tasks = client.store.get_tasks(r.run_id)
    done = sum(1 for t in tasks if t.state == TaskState.SUCCEEDED)
    frac = float(done)
    for t in tasks:
        if t.state != TaskState.SUCCEEDED and t.progress_total and t.progress_done is not None:
            frac += min(1.0, max(0.0, t.progress_done / t.progress_total))
    started = min((t.started_at for t in tasks if t.started_at), default=None)
    ends = [t.finished_at for t in tasks if t.finished_at]
    live = r.state in LIVE
    if started is None:
        duration = None
    elif live and controller_alive(r, client.store.now()):
        duration = now - started
    elif live:
        # Nothing drives it (its controller died): it stopped at its last sign of life,
        # the newest write of its controller or of an attempt, not now.
        duration = max([*(t.updated_at for t in tasks), r.updated_at]) - started
    else:
        duration = max([*ends, r.updated_at]) - started
    cost, exact = _cost(client, prices, r.run_id, live)
    prio = int(r.options.get("priority", 100))
    return Row(r.run_id, r.state.value, shown, priority_name(prio), priority_class(prio), r.flow_name,
               done, len(tasks), frac / len(tasks) if tasks else 0.0, started, duration, cost, exact)


def listing(client: LocalClient, *, state: str | None, flow: str | None, page: int,
            page_size: int = PAGE_SIZE) -> Listing:
    """What ``Client.runs(state=, flow=, limit=, offset=)`` returns, plus the counts the
    filters show (from the store's aggregate, not from every record)."""
    if not client.home.exists():
        return Listing([], 0, 1, 1, {}, [], state, flow)
    store = client.store
    counts = store.run_counts()  # one aggregate query, not every record
    states: Counter[str] = Counter()
    for (st, _), n in counts.items():
        states[st.value] += n
    flows = {f for _, f in counts}
    want = None if not state else RunState(state.upper())
    total = sum(n for (st, f), n in counts.items() if (want is None or st == want) and (not flow or f == flow))
    pages = max(1, -(-total // page_size))
    page = min(max(1, page), pages)
    part = store.list_runs(states=None if want is None else [want], flow=flow or None, limit=page_size,
                           offset=(page - 1) * page_size)
    shown = display_states(store, part)  # "WAITING (batch)" as `segue ls` shows it
    prices = Prices.resolve(client.home.root)
    now = time.time()
    return Listing([_row(client, prices, r, shown[r.run_id], now) for r in part], total, page, pages,
                   dict(sorted(states.items())), sorted(flows), want.value if want else None, flow or None)


def parse_state(value: str | None) -> str | None:
    """A state filter from the query string ('' = all); ValueError names the choices."""
    if not value:
        return None
    try:
        return RunState(value.upper()).value
    except ValueError:
        raise ValueError(f"unknown run state {value!r}; one of "
                         f"{', '.join(s.value for s in RunState)}") from None

