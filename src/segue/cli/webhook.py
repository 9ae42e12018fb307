"""`segue webhook`: notify an HTTP endpoint when runs fail, pause, are preempted or succeed.

    segue webhook add URL --events failed,paused [--secret-file F] [--run RUN]
    segue webhook ls
    segue webhook rm ID
    segue webhook deliveries [--hook ID] [--run RUN]
    segue webhook flush

Hooks belong to the home (``HOME/webhooks.json``, 0600). Every controller
delivers them while it runs, as does `segue server`; `flush` delivers what is
due now, for when neither runs (from cron, say).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from ..client.local import LocalClient
from ..errors import UsageError
from ..notify.hooks import (
    BACKOFF_S,
    DEFAULT_EVENTS,
    EVENTS,
    MAX_ATTEMPTS,
    TIMEOUT_S,
    HooksFile,
    parse_events,
    read_secret_file,
)
from .render import fmt_time, print_json


def add_parsers(sub: Any) -> None:
    w = sub.add_parser("webhook", help="HTTP notifications of run transitions (failed, paused, ...)")
    wsub = w.add_subparsers(dest="webhook_cmd", required=True)
    a = wsub.add_parser("add", help="notify URL of the chosen transitions of this home's runs")
    a.add_argument("url")
    a.add_argument("--events", default=",".join(DEFAULT_EVENTS), metavar="LIST",
                   help=f"comma-separated, of {', '.join(EVENTS)} (default {','.join(DEFAULT_EVENTS)})")
    a.add_argument("--secret-file", default=None, metavar="F",
                   help="the HMAC signing secret, one line (default: a new random one, printed once)")
    a.add_argument("--run", action="append", default=[], metavar="RUN",
                   help="only these runs (repeat for several; default every run of the home)")
    a.add_argument("--max-attempts", type=int, default=MAX_ATTEMPTS, metavar="N",
                   help=f"give a delivery up after N attempts (default {MAX_ATTEMPTS})")
    a.add_argument("--backoff", type=float, default=BACKOFF_S, metavar="S",
                   help=f"first retry after S seconds, doubling each time (default {BACKOFF_S:g})")
    a.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="S",
                   help=f"per request (default {TIMEOUT_S:g})")
    ls = wsub.add_parser("ls", help="the home's webhooks and their deliveries (never the secrets)")
    ls.add_argument("--json", action="store_true")
    wsub.add_parser("rm", help="remove a webhook and its queued deliveries").add_argument("id")
    d = wsub.add_parser("deliveries", help="recent deliveries, newest first")
    d.add_argument("--hook", default=None, metavar="ID")
    d.add_argument("--run", default=None, metavar="RUN")
    d.add_argument("--limit", type=int, default=50, metavar="N")
    d.add_argument("--json", action="store_true")
    f = wsub.add_parser("flush", help="deliver what is due now, retrying within --timeout")
    f.add_argument("--timeout", type=float, default=10.0, metavar="S")


def cmd_webhook(a: argparse.Namespace, client: LocalClient) -> int:
    return {"add": _add, "ls": _ls, "rm": _rm, "deliveries": _deliveries, "flush": _flush}[
        a.webhook_cmd](a, client)


@contextlib.contextmanager
def _outbox(client: LocalClient) -> Iterator[Any]:
    """The home's outbox (SQLite or PostgreSQL, as its store), closed after use."""
    from ..store import open_outbox

    client.home.ensure()  # the database file with its private mode; the outbox migrates it
    box = open_outbox(client.home.root, url=client.home.store)
    try:
        yield box
    finally:
        box.close()


def _add(a: argparse.Namespace, client: LocalClient) -> int:
    events = parse_events(a.events)
    secret = read_secret_file(a.secret_file) if a.secret_file else None
    hooks = HooksFile(client.home)
    hook = hooks.add(a.url, events, secret=secret, runs=a.run,
                                      max_attempts=a.max_attempts, backoff_s=a.backoff,
                                      timeout_s=a.timeout)
    with _outbox(client) as box:
        box.start_hook(hook.id)  # from now on: no backlog of older transitions
    print(hook.id)
    scope = f"runs {', '.join(hook.runs)}" if hook.runs else "every run of the home"
    print(f"webhook {hook.id}: {', '.join(events)} of {scope} -> {hook.url}", file=sys.stderr)
    if secret is None:
        print(f"signing secret (kept in {hooks.path}, mode 0600): {hook.secret}",
              file=sys.stderr)
    return 0


def _ls(a: argparse.Namespace, client: LocalClient) -> int:
    hooks = HooksFile(client.home).load()
    counts: dict[tuple[str, str], int] = {}
    if hooks and client.home.exists():
        with _outbox(client) as box:
            counts = box.counts()
    rows = []
    for h in hooks.values():
        doc = h.to_json(secret=False)
        doc["deliveries"] = {s: counts.get((h.id, s), 0) for s in ("pending", "sending", "delivered",
                                                                  "failed")}
        rows.append(doc)
    if a.json:
        print_json(rows)
        return 0
    for r in rows:
        d = r["deliveries"]
        scope = ",".join(r["runs"]) or "all runs"
        print(f"{r['id']}  {','.join(r['events']):<32} {scope:<16} {r['url']}  "
              f"delivered {d['delivered']}  pending {d['pending'] + d['sending']}  failed {d['failed']}")
    return 0


def _rm(a: argparse.Namespace, client: LocalClient) -> int:
    hook = HooksFile(client.home).remove(a.id)
    dropped = 0
    if client.home.exists():
        with _outbox(client) as box:
            dropped = box.drop_hook(hook.id)
    print(f"webhook {hook.id} removed ({dropped} deliveries forgotten)")
    return 0


def _deliveries(a: argparse.Namespace, client: LocalClient) -> int:
    if a.limit < 1:
        raise UsageError(f"--limit must be >= 1, not {a.limit}")
    rows: list[Any] = []
    if client.home.exists():
        with _outbox(client) as box:
            rows = box.deliveries(hook_id=a.hook, run_id=a.run, limit=a.limit)
    docs = [{"delivery": d.event_id, "hook": d.hook_id, "run_id": d.run_id, "event": d.event,
             "status": d.status, "attempts": d.attempts, "next_at": d.next_at,
             "last_error": d.last_error, "created_at": d.created_at, "updated_at": d.updated_at}
            for d in rows]
    if a.json:
        print_json(docs)
        return 0
    for d in docs:
        extra = f"  next {fmt_time(d['next_at'])}" if d["status"] == "pending" else ""
        err = f"  ({d['last_error']})" if d["last_error"] and d["status"] != "delivered" else ""
        print(f"{d['delivery']:>8} {d['hook']} {d['event']:<10} {d['run_id']:<24} {d['status']:<9} "
              f"attempts {d['attempts']}{extra}{err}")
    return 0


def _flush(a: argparse.Namespace, client: LocalClient) -> int:
    from ..notify.pump import Pump

    if not 0 < a.timeout <= 3600:
        raise UsageError("--timeout must be > 0 and <= 3600 seconds")
    if not client.home.exists():
        print("no deliveries: the home has no store yet")
        return 0
    pump = Pump(client.home)
    try:
        delivered, given_up = pump.drain(a.timeout)
        left = sum(n for (_, s), n in pump.outbox.counts().items() if s in ("pending", "sending"))
    finally:
        pump.close()
    print(f"delivered {delivered}, gave up {given_up}, still pending {left}")
    return 0 if not left and not given_up else 1
