"""The peer of benchmarks.queues: a plain redis-py consumer, as a careful user writes one.

    python -m benchmarks._plain_queue URL STREAM OUT_FILE BATCH

Per batch of BATCH entries (XREADGROUP): transform, append the records to one JSONL
file, flush and fsync it, then XACK the batch; it stops at the first empty read. The
output is durable before the ack, so a crash loses nothing, but one after the fsync and
before the ack writes the batch twice: this loop is at-least-once, segue exactly-once.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import redis


def main() -> None:
    url, stream, out, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    r: Any = redis.Redis.from_url(url, decode_responses=True)  # redis-py's stubs type replies loosely
    try:
        r.xgroup_create(stream, "plain", id="0")
    except redis.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise
    n = 0
    with open(out, "a", encoding="utf-8") as f:
        while True:
            got = r.xreadgroup("plain", "c0", {stream: ">"}, count=batch)
            entries = got[0][1] if got else []
            if not entries:
                break
            lines = []
            for _, fields in entries:
                rec = json.loads(fields["data"])
                lines.append(json.dumps({"k": rec["k"], "v": rec["v"].upper()}) + "\n")
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())
            r.xack(stream, "plain", *(mid for mid, _ in entries))
            n += len(entries)
    print(json.dumps({"records": n}))


if __name__ == "__main__":
    main()
