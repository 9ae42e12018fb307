"""Small builders shared by the store tests (and the race worker script)."""

from __future__ import annotations

from collections.abc import Sequence

from segue.states import Actor
from segue.store import NewRun, RunRecord, Store

STEPS = ("load", "train", "eval")
BACKENDS = ["sqlite", "postgres"]  # every backend the contract tests run against


def new_run(run_id: str = "r1") -> NewRun:
    return NewRun(
        run_id=run_id,
        flow_name="demo",
        flow_path="/flows/demo.py",
        params={"lr": 0.1, "layers": [1, 2], "name": "ü"},
        fingerprint={"code": "abc123"},
        options={"retries": 2},
    )


def make_run(store: Store, run_id: str = "r1", steps: Sequence[str] = STEPS) -> RunRecord:
    return store.create_run(new_run(run_id), steps, actor=Actor.CLI)


def snapshot(store: Store, run_id: str = "r1") -> tuple:
    """Everything the store holds about a run, for 'nothing changed' checks.

    A refused (fenced) write changes nothing but appends a ``fenced`` event
    that records the refusal; those are left out here and counted by the tests
    that expect them."""
    statuses = ("committed", "quarantined", "pruned")
    return (
        store.get_run(run_id),
        store.get_tasks(run_id),
        store.list_checkpoints(run_id, statuses=statuses),
        [e for e in store.list_events(run_id) if e.kind != "fenced"],
    )


def refusals(store: Store, run_id: str = "r1") -> list:
    """The ``fenced`` events: one per write refused to a superseded epoch."""
    return [e for e in store.list_events(run_id) if e.kind == "fenced"]


def open_target(target: str) -> Store:
    """The store at ``target``: a PostgreSQL URL or an SQLite file's path."""
    from segue.store import SQLiteStore
    from segue.store.postgres import PostgresStore, is_postgres_url

    return PostgresStore(target) if is_postgres_url(target) else SQLiteStore(target)
