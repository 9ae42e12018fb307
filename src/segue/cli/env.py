"""`segue env RUN [--json]`: the environment a run recorded and the diff to now
(the CLI over ``Client.environment``; see segue.run.environment)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..client.local import LocalClient
from ..run.environment import describe
from .render import fmt_time, print_json


def add_parser(sub: Any) -> None:
    e = sub.add_parser("env", help="the environment a run recorded, and what changed since")
    e.add_argument("run")
    e.add_argument("--json", action="store_true")
    e.add_argument("--all", action="store_true",
                   help="also list every installed distribution the run recorded, with its version")


def cmd_env(a: argparse.Namespace, client: LocalClient) -> int:
    doc = client.environment(a.run)
    if a.json:
        print_json(doc)
        return 0
    rec = doc["recorded"]
    if rec is None:
        print(f"run {a.run} has no recorded environment (it began before segue recorded them); "
              f"its next resume records one")
        return 0
    print(f"run {a.run}  recorded at {doc['recorded_at']} {fmt_time(doc['recorded_time'])}  "
          f"on_env_change={doc['policy']}")
    for line in describe(rec, doc["imported"], show_all=a.all):
        print(f"  {line}")
    if not a.all:
        print("  (--all lists the distributions)")
    changes = doc["changes"]
    if not changes:
        print("no changes since")
        return 0
    print(f"changes since ({'a resume would be refused' if doc['would_refuse'] else 'a resume goes on'}):")
    for c in changes:
        mark = "!" if c["blocking"] else "~"
        steps = f"  (imported by {', '.join(c['steps'])})" if c["steps"] else ""
        print(f"  {mark} {c['text']}{steps}")
    return 0


def warn_after_resume(client: LocalClient, run: str) -> None:
    """Print on stderr the warning of the environment event the resume just requested wrote
    (after its "command" event), if any."""
    asked = client.store.list_events(run, kinds=("command",))
    after = asked[-1].id if asked else 0
    for e in client.store.list_events(run, after_id=after, kinds=("environment",)):
        if e.step is None and e.data.get("warning"):
            print(f"segue: warning: {e.data['warning']}", file=sys.stderr)
