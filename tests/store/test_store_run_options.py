"""Store contract: a run's stored options can be replaced (``segue resume --on-input-change``)."""

from __future__ import annotations

import pytest
from _store_helpers import BACKENDS, make_run

from segue.errors import UnknownRunError
from segue.states import Actor
from segue.store import Store

pytestmark = pytest.mark.parametrize("store", BACKENDS, indirect=True)


def test_set_run_options_replaces_them_with_an_event(store: Store) -> None:
    make_run(store)
    rec = store.set_run_options("r1", {"retries": 2, "on_input_change": "pin"}, actor=Actor.CLI,
                                reason="options changed at resume")
    assert rec.options == {"retries": 2, "on_input_change": "pin"}
    assert store.get_run("r1").options == rec.options
    ev = store.list_events("r1")[-1]
    assert (ev.kind, ev.reason, ev.data) == ("options", "options changed at resume", rec.options)


def test_set_run_options_of_an_unknown_run_writes_nothing(store: Store) -> None:
    with pytest.raises(UnknownRunError):
        store.set_run_options("nope", {}, actor=Actor.CLI, reason="x")
    assert store.list_runs() == []
