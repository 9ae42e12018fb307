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

from typing import Any

from .errors import InputChangedError

POLICIES = ("fail", "pin", "include-new")


def changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """(added, removed, modified) descriptions, each in item order."""
    a, b = old.get("items", {}), new.get("items", {})
    added = [f"added {k}" for k in b if k not in a]
    removed = [f"removed {k}" for k in a if k not in b]
    modified = []
    for k, attrs in a.items():
        if k in b and b[k] != attrs:
            diffs = ", ".join(f"{f} {attrs.get(f)!r} -> {b[k].get(f)!r}"
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
    if policy == "fail":
        raise InputChangedError(step, added + removed + modified)
    if policy == "pin":
        fatal = removed + _shrunk(old, new)
        if fatal:
            raise InputChangedError(step, fatal)
        return old
    if removed or modified:
        raise InputChangedError(step, removed + modified)
    items = dict(old["items"])
    for k in new["items"]:
        if k not in items:
            items[k] = new["items"][k]
    return {**old, "items": items}
