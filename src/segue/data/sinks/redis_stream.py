"""A Redis stream as a sink: parts staged in Redis, published by one Lua script with a ledger.

Keys, all with the stream's name as the cluster hash tag (one slot)::

    segue:{STREAM}:staged:RUN/STEP/eEPOCH/pPART   list: output id, payload, output id, ...
    segue:{STREAM}:stagedset:RUN/STEP             the staged keys of RUN/STEP
    segue:{STREAM}:fence:RUN/STEP                 highest epoch that opened the sink
    segue:{STREAM}:ledger                         hash: output id -> the entry id it got

``stage()`` pushes a part under its staged key; the step's checkpoint then
records the part (the commit point); ``publish()`` runs one script that, for
each output whose id is not in the ledger, ``XADD``s it (fields ``field`` =
the JSON record and ``segue_id`` = the output id) and records it in the
ledger, then deletes the staged part. The script is atomic in Redis, and with
``appendonly yes`` and ``appendfsync always`` it is durable as a whole before
its reply, so an output is added exactly once: a part published twice (a
crash after the script, before the step noticed) finds its ids in the ledger.
Every script refuses an epoch below the fence (``FencedError``).

Output ids are ``RUN/STEP/KEY`` with KEY from ``key(record)`` or, by
default, the map step's (shard, ordinal) key. The ledger is never trimmed
(one hash field per output); a stream trimmed with ``maxlen`` keeps its ledger.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import FencedError
from .._redis import connect
from .base import Scope, Sink

CHUNK = 1000  # arguments per RPUSH inside the staging script (Lua's unpack limit is ~8000)

_FENCE = """
local f = tonumber(redis.call('GET', KEYS[1]) or '0')
if f > tonumber(ARGV[1]) then return redis.error_reply('SEGUEFENCED ' .. f) end
"""

OPEN = _FENCE + "redis.call('SET', KEYS[1], ARGV[1]) return 1"

STAGE = (
    _FENCE
    + """
redis.call('DEL', KEYS[2])
for i = 2, #ARGV, CHUNK do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + CHUNK - 1, #ARGV)))
end
redis.call('SADD', KEYS[3], KEYS[2])
return 1
""".replace("CHUNK", str(CHUNK))
)

PUBLISH = (
    _FENCE
    + """
local items = redis.call('LRANGE', KEYS[2], 0, -1)
local sent, skipped = 0, 0
for i = 1, #items, 2 do
  local id = items[i]
  if redis.call('HSETNX', KEYS[4], id, '') == 1 then
    local args = {KEYS[5]}
    if ARGV[3] ~= '' then table.insert(args, 'MAXLEN') table.insert(args, '~') table.insert(args, ARGV[3]) end
    table.insert(args, '*')
    table.insert(args, ARGV[2]) table.insert(args, items[i + 1])
    table.insert(args, 'segue_id') table.insert(args, id)
    redis.call('HSET', KEYS[4], id, redis.call('XADD', unpack(args)))
    sent = sent + 1
  else
    skipped = skipped + 1
  end
end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], KEYS[2])
return {sent, skipped}
"""
)


class RedisStreamSink(Sink):
    """Each record, as JSON in ``field``, added to the Redis stream ``stream`` exactly once."""

    needs_keys = True

    def __init__(
        self,
        url: str,
        stream: str,
        *,
        field: str = "data",
        key: Callable[[Any], str] | None = None,
        maxlen: int | None = None,
    ) -> None:
        self.url, self.stream, self.field, self.key, self.maxlen = url, stream, field, key, maxlen
        self._conn: Any = None
        self._scope: Scope | None = None
        self._buf: list[str] = []  # output id, payload, output id, ...
        self._next_part = 0
        self._pending: list[int] = []
        self.sent = 0
        self.skipped = 0  # outputs whose id the ledger already held

    # -- keys and scripts ----------------------------------------------------------
    @property
    def scope(self) -> Scope:
        if self._scope is None:
            raise RuntimeError("sink used before open()")
        return self._scope

    def _k(self, what: str, rest: str = "") -> str:
        return f"segue:{{{self.stream}}}:{what}{rest}"

    def _staged(self, part: int, epoch: int) -> str:
        return self._k("staged:", f"{self.scope.prefix}e{epoch}/p{part:08d}")

    def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return self._conn.eval(script, len(keys), *keys, *args)
        except Exception as exc:  # redis.ResponseError; redis is imported lazily
            if "SEGUEFENCED" not in str(exc):
                raise
            owner = str(exc).split("SEGUEFENCED", 1)[1].strip()
            raise FencedError(
                f"publish from epoch {self.scope.epoch} rejected: epoch {owner} owns "
                f"{self.scope.prefix} of stream {self.stream!r}; this attempt must stop"
            ) from None

    def _publish_key(self, staged: str) -> None:
        s = self.scope
        sent, skipped = self._run(
            PUBLISH,
            [
                self._k("fence:", s.prefix),
                staged,
                self._k("stagedset:", s.prefix),
                self._k("ledger"),
                self.stream,
            ],
            [s.epoch, self.field, "" if self.maxlen is None else self.maxlen],
        )
        self.sent += int(sent)
        self.skipped += int(skipped)

    # -- the Sink contract ---------------------------------------------------------
    def open(self, scope: Scope, state: dict[str, Any] | None) -> None:
        self._scope = scope
        self._conn = connect(self.url, "RedisStreamSink")
        self._run(OPEN, [self._k("fence:", scope.prefix)], [scope.epoch])
        keep = (
            [] if state is None else [self._staged(p["part"], p["epoch"]) for p in state["pending"]]
        )
        for staged in keep:  # roll forward: a part already published finds nothing left to add
            self._publish_key(staged)
        index = self._k("stagedset:", scope.prefix)
        for leftover in self._conn.smembers(index):  # roll back what no checkpoint recorded
            self._conn.delete(leftover)
            self._conn.srem(index, leftover)
        self._next_part = 0 if state is None else int(state["next_part"])
        self._pending = []
        self._buf = []

    def write(self, records: Sequence[Any], shard: str, keys: Sequence[str] | None = None) -> None:
        prefix = self.scope.prefix
        if self.key is not None:
            keys = [self.key(r) for r in records]
        if keys is None or len(keys) != len(records):
            raise ValueError("the Redis stream sink needs one key per record")
        for k, r in zip(keys, records, strict=True):
            self._buf += (prefix + k, json.dumps(r))

    def stage(self) -> None:
        if not self._buf:
            return
        s, part = self.scope, self._next_part
        self._run(
            STAGE,
            [
                self._k("fence:", s.prefix),
                self._staged(part, s.epoch),
                self._k("stagedset:", s.prefix),
            ],
            [s.epoch, *self._buf],
        )
        self._next_part += 1
        self._pending.append(part)
        self._buf = []

    def state(self) -> dict[str, Any]:
        return {
            "next_part": self._next_part,
            "pending": [{"part": p, "epoch": self.scope.epoch} for p in self._pending],
        }

    def publish(self) -> None:
        for part in self._pending:
            self._publish_key(self._staged(part, self.scope.epoch))
        self._pending = []

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def finish(self) -> None:
        self.close()

    def describe(self) -> str:
        return f"redis stream {self.stream!r} at {self.url}"
