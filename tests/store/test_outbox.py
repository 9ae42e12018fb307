"""The webhook outbox and the /metrics event reader, on both backends.

The contract (cursors, enqueue, claim, settle, leases, forgetting) runs on SQLite
and PostgreSQL alike. The PostgreSQL-only tests drive the case that makes its
cursor a commit position rather than an event id: two transactions on two runs,
the one holding the *lower* event id committing *after* a reader already read
the higher one. Raw psycopg connections hold those transactions open.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _store_helpers import BACKENDS, make_run

from segue.states import Actor, RunState
from segue.store import SQLiteStore, Store
from segue.store.metrics_rows import MetricsReader
from segue.store.outbox import SQLiteOutbox

T0 = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def _outbox(store: Store, clock: Clock) -> Any:
    if isinstance(store, SQLiteStore):
        return SQLiteOutbox(store.path, clock=clock)
    from segue.store.postgres_outbox import PostgresOutbox

    return PostgresOutbox(store, clock=clock)  # type: ignore[arg-type]


def _reader(store: Store) -> Any:
    if isinstance(store, SQLiteStore):
        return MetricsReader(store.path)
    from segue.store.postgres_metrics import PostgresMetricsReader

    return PostgresMetricsReader(store)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def box(store: Store, clock: Clock) -> Iterator[Any]:
    b = _outbox(store, clock)
    yield b
    b.close()


def _fail(store: Store, run_id: str) -> int:
    """Create the run and fail it; the FAILED transition's event id."""
    make_run(store, run_id)
    store.transition_run(run_id, RunState.RUNNING, actor=Actor.CLI, reason="go")
    store.transition_run(run_id, RunState.FAILED, actor=Actor.CONTROLLER, reason="boom")
    return next(e.id for e in store.list_events(run_id) if e.to_state == "FAILED")


def _queue(box: Any, hook: str, events: list[Any], upto: int) -> int:
    return int(box.enqueue(hook, [(e.id, e.run_id, "failed", f'{{"d":{e.id}}}') for e in events],
                           upto=upto))


# -- the contract, on both backends ------------------------------------------------------
@pytest.mark.parametrize("store", BACKENDS, indirect=True)
def test_a_new_hook_gets_no_backlog_and_reads_on_from_its_cursor(store: Store, box: Any) -> None:
    _fail(store, "old")
    cur = box.start_hook("h1")
    assert box.start_hook("h1") == cur  # a hook that has a cursor keeps it
    upto, events = box.run_events(cur)
    assert [e for e in events if e.pos > cur] == []  # nothing from before the hook
    failed = _fail(store, "new")
    upto, events = box.run_events(cur)
    assert [(e.run_id, e.to_state) for e in events] == [
        ("new", "PENDING"), ("new", "RUNNING"), ("new", "FAILED")]
    assert all(e.pos > cur for e in events) and upto >= max(e.pos for e in events)
    assert upto == box.last_position()
    [f] = [e for e in events if e.to_state == "FAILED"]
    assert f.id == failed and f.flow == "demo" and f.actor == "controller" and f.reason == "boom"
    assert _queue(box, "h1", [f], upto) == 1
    assert box.cursors(["h1"]) == {"h1": upto}
    assert box.run_events(upto)[1] == []  # consumed
    assert _queue(box, "h1", [f], cur) == 0  # idempotent, and the cursor never moves back
    assert box.cursors(["h1"]) == {"h1": upto}
    [d] = box.deliveries()
    assert (d.event_id, d.hook_id, d.run_id, d.event, d.status, d.attempts) == (
        failed, "h1", "new", "failed", "pending", 0)
    assert d.body == f'{{"d":{failed}}}' and d.created_at == d.next_at == T0
    # a hook seen for the first time by cursors() starts at the end as well
    assert box.cursors(["h1", "h2"])["h2"] >= upto


@pytest.mark.parametrize("store", BACKENDS, indirect=True)
def test_run_events_pages_are_limited_and_cover_the_log(store: Store, box: Any) -> None:
    cur = box.start_hook("h")
    for i in range(5):
        _fail(store, f"r{i}")
    seen, after = [], cur
    while True:
        upto, events = box.run_events(after, limit=3)
        seen += events
        if upto == after:
            break
        after = upto
    assert sorted(e.id for e in seen) == sorted(
        e.id for i in range(5) for e in store.list_events(f"r{i}")
        if e.kind == "run" and e.to_state is not None)
    assert len({e.id for e in seen}) == len(seen) == 15  # PENDING, RUNNING, FAILED of each, once


@pytest.mark.parametrize("store", BACKENDS, indirect=True)
def test_claim_settle_and_an_expired_lease(store: Store, box: Any, clock: Clock) -> None:
    cur = box.start_hook("h")
    failed = _fail(store, "r")
    upto, events = box.run_events(cur)
    _queue(box, "h", [e for e in events if e.id == failed], upto)
    [d] = box.due()
    assert d.event_id == failed and d.status == "pending"
    got = box.claim(failed, "h", owner="A", lease_s=10)
    assert got.status == "sending" and got.claim == "A" and got.attempts == 1
    assert got.lease_until == T0 + 10
    assert box.claim(failed, "h", owner="B", lease_s=10) is None  # A has it
    assert box.due() == [] and box.next_due() == T0 + 10
    clock.t += 11  # A died mid-send: its lease expires and B takes over
    [d] = box.due()
    assert d.status == "sending" and d.claim == "A"
    got = box.claim(failed, "h", owner="B", lease_s=10)
    assert got.claim == "B" and got.attempts == 2
    assert box.settle(failed, "h", owner="A", status="delivered") is False  # A lost its claim
    assert box.settle(failed, "h", owner="B", status="pending", next_at=clock.t + 5,
                      error="HTTP 500") is True
    [d] = box.deliveries(hook_id="h", run_id="r")
    assert (d.status, d.last_error, d.claim, d.lease_until) == ("pending", "HTTP 500", None, None)
    assert box.due() == [] and box.next_due() == clock.t + 5  # backing off
    assert box.claim(failed, "h", owner="B", lease_s=10) is None
    clock.t += 5
    assert box.claim(failed, "h", owner="B", lease_s=10).attempts == 3
    assert box.settle(failed, "h", owner="B", status="delivered") is True
    assert box.settle(failed, "h", owner="B", status="delivered") is False  # settled once
    assert box.counts() == {("h", "delivered"): 1} and box.next_due() is None and box.due() == []
    assert box.deliveries(hook_id="other") == [] and box.deliveries(run_id="other") == []
    with pytest.raises(ValueError, match="settles as pending, delivered or failed, not 'sending'"):
        box.settle(failed, "h", owner="B", status="sending")
    # delivered rows are forgotten once old enough (the events stay)
    assert box.forget_delivered(older_than_s=60) == 0
    clock.t += 61
    assert box.forget_delivered(older_than_s=60) == 1
    assert box.deliveries() == [] and any(e.id == failed for e in store.list_events("r"))


@pytest.mark.parametrize("store", BACKENDS, indirect=True)
def test_drop_hook_forgets_its_deliveries_and_cursor(store: Store, box: Any) -> None:
    cur = box.start_hook("h")
    box.start_hook("keep")
    for i in range(3):
        _fail(store, f"r{i}")
    upto, events = box.run_events(cur)
    failed = [e for e in events if e.to_state == "FAILED"]
    assert _queue(box, "h", failed, upto) == 3 and _queue(box, "keep", failed[:1], upto) == 1
    assert box.drop_hook("h") == 3
    assert box.counts() == {("keep", "pending"): 1}
    assert box.cursors(["h"])["h"] >= upto  # a hook added again gets no backlog


@pytest.mark.parametrize("store", BACKENDS, indirect=True)
def test_metrics_reader_pages_to_the_last_position(store: Store) -> None:
    reader = _reader(store)
    try:
        assert reader.last_position() == 0 and reader.events_after(0, 0) == []
        for i in range(4):
            _fail(store, f"r{i}")
        upto, after, seen = reader.last_position(), 0, []
        while after < upto:
            page = reader.events_after(after, upto, limit=3)
            assert page
            seen += page
            after = max(e.pos for e in page)
        want = [e.id for i in range(4) for e in store.list_events(f"r{i}")]
        assert sorted(e.id for e in seen) == sorted(want)
        assert reader.now().runs_by_state == {"FAILED": 4}
    finally:
        reader.close()


# -- PostgreSQL: a lower event id that commits late ---------------------------------------
def _pg(store: Store) -> Any:
    import psycopg

    conn = psycopg.connect(store.url)  # type: ignore[attr-defined]  # a transaction we hold
    conn.execute("SET idle_in_transaction_session_timeout = 0")
    return conn


def _raw_event(conn: Any, run_id: str) -> int:
    row = conn.execute(
        "INSERT INTO events (run_id, time, actor, kind, from_state, to_state, reason, data)"
        " VALUES (%s, 0, 'controller', 'run', 'RUNNING', 'FAILED', 'late', '{}') RETURNING id",
        (run_id,)).fetchone()
    return int(row[0])


@pytest.fixture
def late_commit(store: Store) -> Iterator[tuple[Any, Any, int, int]]:
    """Run ``a``'s event id 10-ish is drawn *after* run ``b``'s transaction began
    (``b`` holds an older xid) but *before* ``b``'s own event: ids a < b, and ``b``
    commits first. Yields (connection of a, uncommitted; and of b), id a, id b."""
    make_run(store, "a")
    make_run(store, "b")
    ca, cb = _pg(store), _pg(store)
    try:
        cb.execute("SELECT pg_current_xact_id()")  # b's transaction has its xid first
        id_a = _raw_event(ca, "a")
        id_b = _raw_event(cb, "b")
        assert id_a < id_b
        cb.commit()
        yield ca, cb, id_a, id_b
    finally:
        ca.close()
        cb.close()


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_outbox_gets_an_event_committed_after_a_higher_id_was_read(
        store: Store, box: Any, late_commit: tuple[Any, Any, int, int]) -> None:
    ca, _, id_a, id_b = late_commit
    cur = 0  # from the start of the log (a hook's cursor as enqueue leaves it)
    upto, events = box.run_events(cur)
    assert [e.id for e in events if e.reason == "late"] == [id_b]  # a's is not committed yet
    assert _queue(box, "h", [e for e in events if e.reason == "late"], upto) == 1  # past b's
    ca.commit()  # the lower id commits now
    upto2, events = box.run_events(box.cursors(["h"])["h"])
    assert [e.id for e in events] == [id_a] and upto2 > upto
    assert _queue(box, "h", events, upto2) == 1
    assert box.run_events(upto2)[1] == []  # exactly once
    assert sorted(d.event_id for d in box.deliveries()) == [id_a, id_b]


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_metrics_reader_gets_an_event_committed_after_a_higher_id_was_read(
        store: Store, late_commit: tuple[Any, Any, int, int]) -> None:
    ca, _, id_a, id_b = late_commit
    reader = _reader(store)
    try:
        upto = reader.last_position()
        first = reader.events_after(0, upto)
        assert [e.id for e in first if e.kind == "run" and e.to_state == "FAILED"] == [id_b]
        assert max(e.pos for e in first) == upto
        assert id_a not in [e.id for e in reader.events_after(0, upto)]
        ca.commit()
        upto2 = reader.last_position()
        assert upto2 > upto
        assert [e.id for e in reader.events_after(upto, upto2)] == [id_a]
        assert reader.events_after(upto2, reader.last_position()) == []
    finally:
        reader.close()


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_an_open_transaction_holds_the_line_for_later_ones(store: Store, box: Any) -> None:
    """A transaction that began first (lower xid, lower id) and commits last: nothing
    after it is read before it commits (a reader that read run b's events now would
    move past a's transaction and skip it), then both, once."""
    make_run(store, "a")
    cur = box.start_hook("h")
    reader = _reader(store)
    ca = _pg(store)
    try:
        id_a = _raw_event(ca, "a")  # the older transaction, still open
        failed = _fail(store, "b")  # committed, above it
        assert failed > id_a
        assert box.run_events(cur) == (box.last_position(), [])
        held = reader.last_position()
        assert [e.run_id for e in reader.events_after(0, held)] == ["a"]  # a's creation only
        ca.commit()
        upto, events = box.run_events(cur)
        assert [e.id for e in events if e.to_state == "FAILED"] == [id_a, failed]
        assert _queue(box, "h", [e for e in events if e.to_state == "FAILED"], upto) == 2
        assert box.run_events(box.cursors(["h"])["h"])[1] == []
        later = reader.events_after(held, reader.last_position())
        assert [e.id for e in later if e.to_state == "FAILED"] == [id_a, failed]
    finally:
        ca.close()
        reader.close()


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_a_page_never_splits_a_transaction(store: Store, box: Any) -> None:
    make_run(store, "a")
    cur = box.start_hook("h")
    with _pg(store) as conn:
        ids = [_raw_event(conn, "a") for _ in range(5)]  # one transaction, five transitions
    _fail(store, "c")
    upto, events = box.run_events(cur, limit=2)
    assert [e.id for e in events] == ids and len({e.pos for e in events}) == 1  # past the limit
    assert upto == events[-1].pos
    seen = []
    while True:
        nxt, page = box.run_events(upto, limit=2)
        seen += page
        if nxt == upto:
            break
        upto = nxt
    assert [(e.run_id, e.to_state) for e in seen] == [("c", "PENDING"), ("c", "RUNNING"),
                                                     ("c", "FAILED")]
    reader = _reader(store)
    try:
        start = min(e.pos for e in events) - 1
        page = reader.events_after(start, reader.last_position(), limit=2)
        assert [e.id for e in page] == ids  # the whole transaction, past the limit
    finally:
        reader.close()


def test_a_database_of_schema_4_gets_commit_positions(new_target: Any) -> None:
    """Events written before the migration share its xid: a reader from the start reads
    them, a hook added after it skips them, and later events follow both."""
    import psycopg

    from segue.store.postgres import PostgresStore
    from segue.store.postgres_outbox import PostgresOutbox
    from segue.store.postgres_schema import MIGRATIONS, migrate

    url = new_target("postgres")
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn, "t", MIGRATIONS[:4])
        conn.execute("INSERT INTO runs (run_id, flow_name, flow_path, params, fingerprint, options,"
                     " state, created_at, updated_at) VALUES ('old', 'f', '/f.py', '{}', '{}', '{}',"
                     " 'RUNNING', 1, 1)")
        old = conn.execute("INSERT INTO events (run_id, time, actor, kind, from_state, to_state,"
                           " reason, data) VALUES ('old', 1, 'cli', 'run', 'PENDING', 'RUNNING',"
                           " 'go', '{}') RETURNING id").fetchone()[0]
    store = PostgresStore(url)  # migrates to the latest version
    box = PostgresOutbox(store)
    try:
        assert [e.id for e in box.run_events(0)[1]] == [old]
        cur = box.start_hook("h")
        store.transition_run("old", RunState.FAILED, actor=Actor.CONTROLLER, reason="boom")
        assert [e.to_state for e in box.run_events(cur)[1]] == ["FAILED"]
    finally:
        store.close()
