"""The host registry on PostgreSQL (see ``Store.register_host``): READ COMMITTED,
the host's row locked (inserted first if new) before it is judged, and the
database's clock read after the lock."""

from __future__ import annotations

from typing import Any, cast

from .._canon import canonical_json
from .base import HostRecord
from .hosts_rows import check_register, check_renew, host_record
from .postgres_schema import Tx


def _locked(tx: Tx, host: str) -> Any:
    return tx.one("SELECT * FROM hosts WHERE host = %s FOR UPDATE", (host,))


class PostgresHostsMixin:
    _write: Any
    _read: Any

    def register_host(self, host: str, *, pid: int, info: dict[str, Any], ttl_s: float,
                      steal: bool = False) -> int:
        def body(tx: Tx) -> int:
            # A new host's row exists (epoch 0, no lease) before anyone judges it, so two
            # agents registering it at once serialise on its row lock.
            tx.one("INSERT INTO hosts (host, epoch, pid, info, started_at, seen_at, lease_until)"
                   " VALUES (%s, 0, NULL, '{}', 0, 0, NULL) ON CONFLICT (host) DO NOTHING RETURNING host",
                   (host,))
            row = _locked(tx, host)
            t = tx.now()
            epoch = check_register(host, None if int(row["epoch"]) == 0 else row, t, steal)
            tx.one("UPDATE hosts SET epoch = %s, pid = %s, info = %s, started_at = %s, seen_at = %s,"
                   " lease_until = %s WHERE host = %s RETURNING host",
                   (epoch, pid, canonical_json(info), t, t, t + ttl_s, host))
            return epoch

        return cast(int, self._write(body))

    def renew_host(self, host: str, epoch: int, ttl_s: float,
                   info: dict[str, Any] | None = None) -> HostRecord:
        def body(tx: Tx) -> HostRecord:
            check_renew(host, _locked(tx, host), epoch)
            t = tx.now()
            return host_record(tx.one(
                "UPDATE hosts SET seen_at = %s, lease_until = %s, info = COALESCE(%s, info)"
                " WHERE host = %s RETURNING *",
                (t, t + ttl_s, None if info is None else canonical_json(info), host)))

        return cast(HostRecord, self._write(body))

    def release_host(self, host: str, epoch: int) -> None:
        self._write(lambda tx: tx.one(
            "UPDATE hosts SET lease_until = NULL WHERE host = %s AND epoch = %s RETURNING host", (host, epoch)))

    def list_hosts(self) -> list[HostRecord]:
        return cast(list[HostRecord], self._read(
            lambda tx: [host_record(r) for r in tx.all("SELECT * FROM hosts WHERE epoch > 0 ORDER BY host")]))
