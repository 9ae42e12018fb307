"""The host registry on SQLite (see ``Store.register_host``): ``BEGIN IMMEDIATE``
serialises every judgement with its write."""

from __future__ import annotations

from typing import Any

from .._canon import canonical_json
from .base import HostRecord
from .hosts_rows import check_register, check_renew, host_record


class SQLiteHostsMixin:
    _write: Any
    _read: Any
    _clock: Any

    def register_host(self, host: str, *, pid: int, info: dict[str, Any], ttl_s: float,
                      steal: bool = False) -> int:
        with self._write() as conn:
            t = self._clock()
            row = conn.execute("SELECT * FROM hosts WHERE host = ?", (host,)).fetchone()
            epoch = check_register(host, row, t, steal)
            conn.execute(
                "INSERT INTO hosts (host, epoch, pid, info, started_at, seen_at, lease_until)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (host) DO UPDATE SET epoch = excluded.epoch,"
                " pid = excluded.pid, info = excluded.info, started_at = excluded.started_at,"
                " seen_at = excluded.seen_at, lease_until = excluded.lease_until",
                (host, epoch, pid, canonical_json(info), t, t, t + ttl_s))
            return epoch

    def renew_host(self, host: str, epoch: int, ttl_s: float,
                   info: dict[str, Any] | None = None) -> HostRecord:
        with self._write() as conn:
            t = self._clock()
            row = conn.execute("SELECT * FROM hosts WHERE host = ?", (host,)).fetchone()
            check_renew(host, row, epoch)
            conn.execute("UPDATE hosts SET seen_at = ?, lease_until = ?, info = COALESCE(?, info)"
                         " WHERE host = ?", (t, t + ttl_s, None if info is None else canonical_json(info), host))
            return host_record(conn.execute("SELECT * FROM hosts WHERE host = ?", (host,)).fetchone())

    def release_host(self, host: str, epoch: int) -> None:
        with self._write() as conn:
            conn.execute("UPDATE hosts SET lease_until = NULL WHERE host = ? AND epoch = ?", (host, epoch))

    def list_hosts(self) -> list[HostRecord]:
        with self._read() as conn:
            return [host_record(r) for r in conn.execute("SELECT * FROM hosts ORDER BY host")]
