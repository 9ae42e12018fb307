"""The queries behind /metrics on PostgreSQL: :class:`~segue.store.metrics_rows.MetricsReader`'s
interface, with the event log paged by commit position (:mod:`segue.store.postgres_outbox`
says why an event id cannot be the cursor there). Nothing here writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .metrics_rows import EVENT_PAGE, MetricEvent, Now
from .postgres_outbox import last_position, page_events
from .postgres_schema import Row, Tx

if TYPE_CHECKING:
    from .postgres import PostgresStore


def _num(doc: str, key: str) -> str:
    """A numeric JSON field of the text column ``doc`` as float8 (NULL if absent or not a number)."""
    return (f"CASE WHEN jsonb_typeof({doc}::jsonb -> '{key}') = 'number'"
            f" THEN ({doc}::jsonb ->> '{key}')::float8 END")


_EVENTS = (
    "SELECT e.xid::text::bigint AS pos, e.id AS id, e.run_id, e.time, e.actor, e.kind,"
    " e.from_state, e.to_state,"
    f" CASE WHEN e.kind = 'checkpoint' AND e.to_state IS NULL THEN {_num('e.data', 'nbytes')}"
    " END AS nbytes,"
    f" CASE WHEN e.kind = 'checkpoint' AND e.to_state IS NULL THEN {_num('e.data', 'duration_s')}"
    " END AS duration_s"
    " FROM events e WHERE e.kind IN ('run', 'task', 'checkpoint')")

_RECORDS = (
    f"SELECT SUM({_num('c.position', 'records_in')}) AS records_in,"
    f" SUM({_num('c.position', 'records_out')}) AS records_out,"
    f" SUM({_num('c.position', 'failures')}) AS failures"
    " FROM checkpoints c WHERE c.status = 'committed'"
    " AND c.seq = (SELECT MAX(seq) FROM checkpoints d WHERE d.run_id = c.run_id"
    " AND d.step = c.step AND d.status = 'committed')")


class PostgresMetricsReader:
    """Read-only aggregate queries over a PostgreSQL store."""

    def __init__(self, store: PostgresStore, *, owns_store: bool = False) -> None:
        self.store = store
        self._owns = owns_store

    def close(self) -> None:
        if self._owns:
            self.store.close()

    def now(self) -> Now:
        """The *now* figures, in one snapshot (REPEATABLE READ, read only)."""
        def body(tx: Tx) -> Now:
            runs = {r["state"]: int(r["n"]) for r in tx.all(
                "SELECT state, COUNT(*) AS n FROM runs GROUP BY state")}
            live = {r["status"]: int(r["n"] or 0) for r in tx.all(
                "SELECT status, SUM(nbytes) AS n FROM checkpoints"
                " WHERE status IN ('committed','quarantined') GROUP BY status")}
            rec = tx.one(_RECORDS) or {}
            deliveries = {r["status"]: int(r["n"]) for r in tx.all(
                "SELECT status, COUNT(*) AS n FROM notify_outbox GROUP BY status")}
            latest = [(r["flow_name"], r["step"], r["name"], r["value"]) for r in tx.all(
                "SELECT flow_name, step, name, value FROM step_metrics_latest"
                " ORDER BY flow_name, step, name")]
            return Now(runs_by_state=runs, live_checkpoint_bytes=live,
                       records={k: float(rec.get(k) or 0)
                                for k in ("records_in", "records_out", "failures")},
                       deliveries=deliveries, step_metrics=latest)

        return self.store._run(body, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "COMMIT")

    def last_position(self) -> int:
        """The commit position of the newest event a reader may consume (0 for none)."""
        return self.store._read(last_position)

    def events_after(self, after: int, upto: int, *, limit: int = EVENT_PAGE) -> list[MetricEvent]:
        """Run, task and checkpoint events at commit positions ``after < pos <= upto``,
        oldest first: about ``limit``, never part of a transaction (page on from the last
        ``pos`` returned). ``upto`` comes from :meth:`last_position`."""
        rows: list[Row] = self.store._read(
            lambda tx: page_events(tx, _EVENTS, (), after, upto, limit)[0])
        return [MetricEvent(id=int(r["id"]), run_id=r["run_id"], time=r["time"], actor=r["actor"],
                            kind=r["kind"], from_state=r["from_state"], to_state=r["to_state"],
                            nbytes=r["nbytes"], duration_s=r["duration_s"], pos=int(r["pos"]))
                for r in rows]
