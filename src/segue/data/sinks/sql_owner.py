"""Who owns a SQL sink's table: rows of ``segue_sink_owner`` in the same database.

A table belongs to one step of one run, like a file sink's directory. The
rows ``(sink, run_id, step) -> role, exclusive`` say who: ``member`` for the
writers whose rows the table holds (the owner, then appenders), ``retired``
for writers an overwrite replaced (refused from then on). ``exclusive`` is 1
while the table holds this member's rows and nobody else's (it claimed an
empty table, or replaced the previous rows); only then may a restart of its
step delete the rows it published.

Every check and change runs inside the sink's own transactions, so the
ownership and the rows it covers change together:

* ``transactional`` (default): a table owned by another run, or holding rows
  no run claims, is refused (:class:`SinkOwnedError`);
* ``append`` and ``upsert``: the writer joins the members (upsert merges by
  key, which is what a rerun into a shared table wants);
* ``overwrite``: the first publish deletes every row and retires the old
  members in the transaction that copies the first part: a reader sees the
  old rows or the new ones, never a mix.
"""

from __future__ import annotations

from .._sql import Db
from ..errors import SinkOwnedError

OWNERS = """CREATE TABLE IF NOT EXISTS segue_sink_owner (
    sink TEXT NOT NULL, run_id TEXT NOT NULL, step TEXT NOT NULL,
    role TEXT NOT NULL, exclusive INTEGER NOT NULL,
    PRIMARY KEY (sink, run_id, step))"""

ADVICE = "write to another table, or pass mode='append' to add to it or mode='overwrite' to replace it"


class TableOwnership:
    """One writer's view of a table's owners; call its methods inside an open transaction."""

    def __init__(self, db: Db, table: str, run_id: str, step: str, mode: str) -> None:
        self.db, self.table, self.run_id, self.step, self.mode = db, table, run_id, step, mode

    def _lock(self) -> None:
        # SQLite's BEGIN IMMEDIATE already serializes writers; PostgreSQL needs
        # the table lock so two first claims cannot both become owner.
        if self.db.dialect == "postgres":
            self.db.execute("LOCK TABLE segue_sink_owner IN SHARE ROW EXCLUSIVE MODE")

    def _rows(self) -> list[tuple[str, str, str, int]]:
        return [tuple(r) for r in self.db.execute(
            "SELECT run_id, step, role, exclusive FROM segue_sink_owner WHERE sink = ? "
            "ORDER BY role, run_id, step", (self.table,)).fetchall()]

    def _me(self, rows: list[tuple[str, str, str, int]]) -> tuple[str, int] | None:
        for run_id, step, role, exclusive in rows:
            if (run_id, step) == (self.run_id, self.step):
                return role, int(exclusive)
        return None

    def _owners(self, rows: list[tuple[str, str, str, int]]) -> str:
        ms = [f"run {r!r} (step {s!r})" for r, s, role, _ in rows if role == "member"]
        if not ms:
            return "rows no segue run claims"
        return ms[0] if len(ms) == 1 else f"{ms[0]} and {len(ms) - 1} appending run(s)"

    def _add(self, role: str, exclusive: bool) -> None:
        self.db.execute("INSERT INTO segue_sink_owner VALUES (?, ?, ?, ?, ?)",
                        (self.table, self.run_id, self.step, role, int(exclusive)))

    def _has_rows(self) -> bool:
        if not self.db.table_exists(self.table):
            return False  # the sink creates it at its first publish
        return self.db.execute(f"SELECT 1 FROM {self.table} LIMIT 1").fetchone() is not None

    def claim_at_open(self) -> None:
        """Refuse, or record this writer; overwrite waits for its first publish."""
        self._lock()
        rows = self._rows()
        me = self._me(rows)
        if me is not None and me[0] == "retired":
            raise SinkOwnedError(
                f"table {self.table}: the rows of run {self.run_id!r} (step {self.step!r}) were replaced "
                f"by {self._owners(rows)} (mode='overwrite'); this run cannot write there any more")
        if me is not None:
            return
        members = [r for r in rows if r[2] == "member"]
        if self.mode == "overwrite" and (members or self._has_rows()):
            return
        if self.mode == "transactional":
            if members:
                raise SinkOwnedError(f"table {self.table} belongs to {self._owners(rows)}; {ADVICE}")
            if self._has_rows():
                raise SinkOwnedError(f"table {self.table} already holds rows that no segue run claims; "
                                     f"{ADVICE}")
        exclusive = not members and not self._has_rows()
        if members:
            self.db.execute("UPDATE segue_sink_owner SET exclusive = 0 WHERE sink = ?", (self.table,))
        self._add("member", exclusive)

    def before_publish(self) -> None:
        """Refuse a writer that lost the table; an overwrite takes it over (same transaction)."""
        self._lock()
        rows = self._rows()
        me = self._me(rows)
        if me is not None and me[0] == "member":
            return
        if me is not None or self.mode != "overwrite":
            raise SinkOwnedError(f"run {self.run_id!r} (step {self.step!r}) may no longer publish to "
                                 f"table {self.table}: it belongs to {self._owners(rows)}; this attempt "
                                 f"must stop")
        self.db.execute(f"DELETE FROM {self.table}")
        self.db.execute("UPDATE segue_sink_owner SET role = 'retired', exclusive = 0 WHERE sink = ?",
                        (self.table,))
        self._add("member", True)

    def may_discard(self) -> bool:
        """True if every row of the table is this writer's (it may delete them all)."""
        rows = self._rows()
        me = self._me(rows)
        return me == ("member", 1) and sum(1 for r in rows if r[2] == "member") == 1
