"""`segue schedule`: runs of a flow at the times of a cron expression, fired by
`segue agent` (or `segue server`) on the store's clock; see docs/schedules.md."""

from __future__ import annotations

import argparse
from typing import Any

from ..client.local import LocalClient
from ..errors import UsageError
from ..flow import parse_overrides
from ..placement.policy import parse_priority
from ..run import schedules as firing
from ..run.options import RunOptions
from ..scheduler.schedules import CATCH_UP, OVERLAP, fmt_slot
from ..store.pools import open_pool
from .render import print_json


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("schedule", help="run a flow on a cron schedule (fired by `segue agent` or `segue server`)")
    ssub = s.add_subparsers(dest="schedule_cmd", required=True)
    a = ssub.add_parser("add", help="add a schedule: a run of FLOW at every time CRON matches")
    a.add_argument("name", help="the schedule's name: 1-48 letters, digits, '.', '_' or '-'; "
                                "its runs are NAME-YYYYMMDDTHHMMZ (the slot, in UTC)")
    a.add_argument("flow", help="the flow file (loaded and checked now, as `segue run` does)")
    a.add_argument("--cron", required=True, metavar="EXPR",
                   help='five fields: minute hour day-of-month month day-of-week, e.g. "0 2 * * *"')
    a.add_argument("--tz", default="UTC", help="the time zone CRON is read in (default UTC), e.g. Europe/Berlin")
    a.add_argument("--param", "-p", action="append", default=[], metavar="K=V",
                   help="set the flow parameter K to V for every run (repeat for several)")
    a.add_argument("--priority", default=None,
                   help="urgent, high, normal (default) or batch, or an integer")
    a.add_argument("--catch-up", choices=CATCH_UP, default="none",
                   help="slots missed while no agent ran: none (default: only a slot just due), "
                        "latest (the newest one), all (every one, in order)")
    a.add_argument("--overlap", choices=OVERLAP, default="skip",
                   help="a slot whose previous run still runs: skip it (default), queue it until that "
                        "run finished, or cancel that run")
    a.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="GPUs for the steps that use GPUs (as `segue run --gpus`)")
    a.add_argument("--checkpoints", default=None, metavar="URL",
                   help="where the runs keep checkpoints and outputs (as `segue run --checkpoints`)")
    a.add_argument("--preemptible", action=argparse.BooleanOptionalAction, default=None,
                   help="may be paused for higher-priority work (default: batch and normal yes)")
    ls = ssub.add_parser("ls", help="the schedules: next slot, last slot and its run")
    ls.add_argument("--json", action="store_true")
    for cmd, what in (("pause", "stop firing a schedule's slots (until `segue schedule resume`)"),
                      ("resume", "fire a paused schedule's slots again (missed ones per its --catch-up)"),
                      ("rm", "remove a schedule (the runs it fired stay)")):
        ssub.add_parser(cmd, help=what).add_argument("name")


def cmd_schedule(a: argparse.Namespace, client: LocalClient) -> int:
    return {"add": _add, "ls": _ls, "pause": _pause, "resume": _pause, "rm": _rm}[a.schedule_cmd](a, client)


def _add(a: argparse.Namespace, client: LocalClient) -> int:
    if a.gpus is not None and a.gpus < 0:
        raise UsageError(f"--gpus must be 0 or more, not {a.gpus}")
    # SEGUE_<OPTION> variables are the user's defaults, taken now and stored with the
    # schedule (an agent's own environment never reaches the runs it fires).
    opts = RunOptions.from_env().with_changes(
        priority=None if a.priority is None else parse_priority(a.priority), gpus=a.gpus,
        checkpoints=a.checkpoints, preemptible=a.preemptible)
    client.home.ensure()
    store = client.store
    s = firing.add_schedule(store, a.name, a.flow, cron=a.cron, tz=a.tz, params=parse_overrides(a.param),
                            options=opts, catch_up=a.catch_up, overlap=a.overlap, actor=client.actor,
                            pool=lambda: open_pool(client.pool_path, store=store))
    nxt = firing.describe(store, s, store.now())["next_slot"]
    print(f"schedule {s.name} added: {s.cron} ({s.tz}); next slot {fmt_slot(nxt, s.tz)}")
    print("slots are fired by `segue agent` (or `segue server`) on a host of this store")
    return 0


def _ls(a: argparse.Namespace, client: LocalClient) -> int:
    if not client.home.exists():
        rows: list[dict[str, Any]] = []
    else:
        store = client.store
        at = store.now()
        rows = [firing.describe(store, s, at) for s in store.list_schedules()]
    if a.json:
        print_json(rows)
        return 0
    if not rows:
        print("no schedules; add one with: segue schedule add NAME FLOW --cron EXPR")
        return 0
    for r in rows:
        last = "-" if r["last_slot"] is None else fmt_slot(r["last_slot"], r["tz"])
        run = "" if r["last_run"] is None else f" -> {r['last_run']} {r['last_run_state']}"
        state = "PAUSED" if r["paused"] else "active"
        print(f"{r['name']:<20} {state:<7} {r['cron']:<16} {r['tz']:<14} next {fmt_slot(r['next_slot'], r['tz'])}"
              f"  last {last}{run}")
        if r["last_error"]:
            print(f"  last error: {r['last_error']}")
    return 0


def _pause(a: argparse.Namespace, client: LocalClient) -> int:
    paused = a.schedule_cmd == "pause"
    s = client.store.set_schedule_paused(a.name, paused, actor=client.actor)
    print(f"schedule {s.name} {'paused' if paused else 'resumed'}")
    return 0


def _rm(a: argparse.Namespace, client: LocalClient) -> int:
    client.store.remove_schedule(a.name, actor=client.actor)
    print(f"schedule {a.name} removed (the runs it fired stay)")
    return 0
