"""Input pinning: compare the input now with its snapshot from the first start.

A snapshot is ``{"kind": ..., "items": {name: {attr: value}}}`` with items in
shard order (files sorted by path; a table; a sequence). On a restore the
driver takes a new snapshot and reconciles the two under a policy:

* ``fail`` (default): any change raises InputChangedError listing it;
* ``pin``: keep reading the original snapshot (new files ignored, appended
  bytes ignored because shards end at the pinned sizes, new table rows past
  the pinned max key ignored); a removed or shrunk item cannot be pinned and
  raises;
* ``include-new``: the original items plus new ones appended at the end, so
  shard indices already passed stay valid; a removed or modified item raises.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .errors import InputChangedError

POLICIES = ("fail", "pin", "include-new")
# Said wherever include-new cannot go on, so nobody tries it on an appended file.
NEW_FILES_ONLY = "include-new accepts new files only: a file that grew or was rewritten counts as modified"


def _shown(field: str, old: Any, new: Any) -> str:
    """``field old -> new``; an mtime (seconds) as an ISO date in UTC, as precise as it must be."""
    if field != "mtime" or not all(isinstance(v, int | float) for v in (old, new)):
        return f"{field} {old!r} -> {new!r}"

    def iso(t: float, spec: str) -> str:
        return datetime.fromtimestamp(t, UTC).isoformat(timespec=spec).replace("+00:00", "Z")

    spec = "milliseconds" if iso(old, "milliseconds") != iso(new, "milliseconds") else "microseconds"
    return f"mtime {iso(old, spec)} -> {iso(new, spec)}"


def changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """(added, removed, modified) descriptions, each in item order."""
    a, b = old.get("items", {}), new.get("items", {})
    added = [f"added {k}" for k in b if k not in a]
    removed = [f"removed {k}" for k in a if k not in b]
    modified = []
    for k, attrs in a.items():
        if k in b and b[k] != attrs:
            diffs = ", ".join(_shown(f, attrs.get(f), b[k].get(f))
                              for f in sorted(set(attrs) | set(b[k])) if attrs.get(f) != b[k].get(f))
            modified.append(f"modified {k} ({diffs})")
    return added, removed, modified


def _shrunk(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    out = []
    for k, attrs in old.get("items", {}).items():
        now = new.get("items", {}).get(k)
        if now is not None and "size" in attrs and (now.get("size") or 0) < attrs["size"]:
            out.append(f"shrunk {k} ({attrs['size']} -> {now.get('size')} bytes)")
    return out


def reconcile(old: dict[str, Any], new: dict[str, Any], policy: str, step: str = "?") -> dict[str, Any]:
    """The snapshot to read now; raises InputChangedError where the policy cannot go on."""
    if policy not in POLICIES:
        raise ValueError(f"on_input_change must be one of {', '.join(POLICIES)}, not {policy!r}")
    added, removed, modified = changes(old, new)
    if not (added or removed or modified):
        return old
    shrunk = _shrunk(old, new)
    can = {"include-new": not (removed or modified), "pin": not (removed or shrunk)}

    def refuse(shown: list[str]) -> InputChangedError:
        accepts = tuple(p for p in ("include-new", "pin") if can[p] and p != policy)
        return InputChangedError(step, shown, accepts=accepts,
                                 note="" if can["include-new"] else NEW_FILES_ONLY)

    if policy == "fail":
        raise refuse(added + removed + modified)
    if policy == "pin":
        if not can["pin"]:
            raise refuse(removed + shrunk)
        return old
    if not can["include-new"]:
        raise refuse(removed + modified)
    items = dict(old["items"])
    for k in new["items"]:
        if k not in items:
            items[k] = new["items"][k]
    return {**old, "items": items}
