"""Step metrics (``put_metrics`` / ``get_metrics``), the contract on every backend: an
upsert keyed by (run, step, name, index), fenced on the attempt's epoch, and the
newest value per (flow, step, name) kept for /metrics."""

from __future__ import annotations

import pytest
from _store_helpers import BACKENDS, make_run, refusals

from segue.errors import FencedError, StoreError, UnknownRunError
from segue.states import Actor, TaskState
from segue.store import Store

pytestmark = pytest.mark.parametrize("store", BACKENDS, indirect=True)

STALE = r"^attempt epoch 1 of step 'train' in run 'r1' was superseded by epoch 2; this attempt must stop$"


def _attempt(store: Store) -> int:
    return store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch


def _points(store: Store, step: str | None = None) -> list[tuple[str, str, int, float | None, int]]:
    return [(p.step, p.name, p.index, p.value, p.epoch) for p in store.get_metrics("r1", step)]


def test_points_are_upserted_by_index_and_ordered(store: Store) -> None:
    make_run(store)
    e1 = _attempt(store)
    assert store.put_metrics("r1", "train", [("loss", 0, 1.0), ("lr", 0, 0.1), ("loss", 1, 0.5),
                                            ("loss", 2, None)], epoch=e1) == 4
    store.transition_task("r1", "train", TaskState.PENDING, actor=Actor.FAILURE_DETECTOR,
                          reason="lease expired")
    e2 = _attempt(store)
    # The resumed attempt redoes index 1 onwards: replaced, never added.
    store.put_metrics("r1", "train", [("loss", 1, 0.25), ("loss", 2, 0.125)], epoch=e2)
    assert _points(store) == [("train", "loss", 0, 1.0, e1), ("train", "loss", 1, 0.25, e2),
                              ("train", "loss", 2, 0.125, e2), ("train", "lr", 0, 0.1, e1)]
    assert store.put_metrics("r1", "train", [], epoch=e2) == 0


def test_a_stale_epoch_writes_nothing_and_is_recorded(store: Store) -> None:
    make_run(store)
    e1 = _attempt(store)
    store.put_metrics("r1", "train", [("loss", 0, 1.0)], epoch=e1)
    store.transition_task("r1", "train", TaskState.PENDING, actor=Actor.FAILURE_DETECTOR,
                          reason="lease expired")
    _attempt(store)
    before = store.get_metrics("r1")
    with pytest.raises(FencedError, match=STALE):
        store.put_metrics("r1", "train", [("loss", 0, 99.0), ("loss", 5, 99.0)], epoch=e1)
    assert store.get_metrics("r1") == before
    assert len(refusals(store)) == 1


def test_filters_by_step_and_time(store: Store) -> None:
    make_run(store)
    e = _attempt(store)
    store.put_metrics("r1", "train", [("loss", 0, 1.0)], epoch=e)
    t = store.get_metrics("r1")[0].time
    e_eval = store.start_attempt("r1", "eval", ttl_s=60, actor=Actor.CONTROLLER).epoch
    store.put_metrics("r1", "eval", [("acc", 0, 0.9)], epoch=e_eval)
    assert [p.step for p in store.get_metrics("r1")] == ["train", "eval"]  # the steps' order
    assert _points(store, "eval") == [("eval", "acc", 0, 0.9, e_eval)]
    assert [p.step for p in store.get_metrics("r1", since=t - 1e-3)] == ["train", "eval"]
    assert store.get_metrics("r1", since=store.get_metrics("r1", "eval")[0].time) == []
    assert store.get_metrics("r1", "load") == []
    with pytest.raises(UnknownRunError):
        store.get_metrics("nope")
    with pytest.raises(StoreError, match=r"^run 'r1' has no step 'nope'$"):
        store.get_metrics("r1", "nope")


def test_the_newest_value_per_flow_is_kept(store: Store) -> None:
    """What /metrics exports: per (flow, step, name), the last point written by any run."""
    from segue.store.sqlite import SQLiteStore

    make_run(store)
    make_run(store, "r2")
    e1 = _attempt(store)
    e2 = store.start_attempt("r2", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch
    store.put_metrics("r1", "train", [("loss", 0, 1.0), ("loss", 1, 0.5), ("lr", 1, None)], epoch=e1)
    store.put_metrics("r2", "train", [("loss", 0, 3.0)], epoch=e2)
    if isinstance(store, SQLiteStore):
        from segue.store.metrics_rows import MetricsReader

        now = MetricsReader(store.path).now()
    else:
        from segue.store.postgres_metrics import PostgresMetricsReader

        now = PostgresMetricsReader(store).now()  # type: ignore[arg-type]
    assert now.step_metrics == [("demo", "train", "loss", 3.0), ("demo", "train", "lr", None)]
