"""The run's DAG for the run page: edges, layers, and fan-outs folded into one node.

The store keeps the steps (in topological order) but not their edges. The
edges come from the run's flow file, read with :mod:`ast` (never executed: the
server must not run user code to draw a page), and only while the file is
byte-identical to the one the run fingerprinted; otherwise the steps are laid
out in their order with no edges, and the page says so.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

_MAX_FLOW_BYTES = 2 * 1024 * 1024
_STEM = re.compile(r"^(.*?)[_-]?(\d+)$")
COLLAPSE_AT = 4  # a group of this many numbered siblings becomes one node...
COLLAPSE_OVER = 12  # ...in a run of more than this many steps

# Colours come from CSS classes (st-RUNNING...); this order picks a folded node's class.
_PRIORITY = ("FAILED", "RUNNING", "RETRYING", "PARKED", "PENDING", "CANCELLED", "SUCCEEDED", "SKIPPED")


def flow_edges(flow_path: str, file_digest: str | None, steps: Sequence[str]) -> list[tuple[str, str]] | None:
    """(upstream, step) pairs declared by ``after=[...]``, or None when they cannot be trusted."""
    p = Path(flow_path)
    try:
        if not p.is_file() or p.stat().st_size > _MAX_FLOW_BYTES:
            return None
        source = p.read_bytes()
    except OSError:
        return None
    if file_digest is None or hashlib.sha256(source).hexdigest() != file_digest:
        return None  # the file changed since the run began: its edges may differ
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    known = set(steps)
    edges = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name not in known:
            continue
        for dec in node.decorator_list:
            if not isinstance(dec, ast.Call):
                continue
            for kw in dec.keywords:
                # after=[...], and a fan-out's over=PARENT (segue's flow.foreach)
                if kw.arg == "over" and isinstance(kw.value, ast.Name | ast.Constant):
                    elts: list[ast.expr] = [kw.value]
                elif kw.arg == "after" and isinstance(kw.value, ast.List | ast.Tuple):
                    elts = list(kw.value.elts)
                else:
                    continue
                for el in elts:
                    up = el.id if isinstance(el, ast.Name) else (
                        el.value if isinstance(el, ast.Constant) and isinstance(el.value, str) else None)
                    if up in known and (up, node.name) not in edges:
                        edges.append((up, node.name))
    return edges


@dataclass
class Node:
    id: str
    label: str
    state: str  # the CSS state class
    members: list[str]
    counts: dict[str, int] = field(default_factory=dict)  # state -> steps, for a folded node
    group: str | None = None  # the folded group's name ("shard*")
    layer: int = 0
    row: int = 0
    x: float = 0.0
    y: float = 0.0
    mark: Mark | None = None  # where the run was interrupted: on the step(s) it stopped

    @property
    def folded(self) -> bool:
        return len(self.members) > 1


@dataclass(frozen=True)
class Mark:
    """An interruption marker on a node: the latest gap of its steps, and how many there were."""

    kind: str  # the gap kind: pause | preempt | crash | failure | lost | deadline | code | other
    label: str  # what stopped it, e.g. "preempted by run hi; resumed by scheduler"
    count: int


@dataclass
class Graph:
    nodes: list[Node]
    edges: list[tuple[Node, Node]]
    has_edges: bool  # False: edges unknown, steps shown in order
    width: float
    height: float
    groups: dict[str, list[str]]  # folded group -> its steps


NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 150.0, 34.0, 50.0, 14.0, 10.0


def mark_interruptions(graph: Graph, gaps: Sequence[tuple[str, str, str, float]]) -> None:
    """Put a marker on every node whose steps were interrupted: ``gaps`` are (step, kind,
    cause, start) of the time steps spent stopped between attempts (History.gaps)."""
    node_of = {m: n for n in graph.nodes for m in n.members}
    latest: dict[str, tuple[float, str, str]] = {}
    counts: dict[str, int] = {}
    for step, kind, cause, start in gaps:
        n = node_of.get(step)
        if n is None:
            continue
        counts[n.id] = counts.get(n.id, 0) + 1
        if n.id not in latest or start >= latest[n.id][0]:
            latest[n.id] = (start, kind, f"{step}: {cause}" if n.folded else cause)
    for n in graph.nodes:
        if n.id in latest:
            _, kind, label = latest[n.id]
            n.mark = Mark(kind, label, counts[n.id])


def group_of(step: str) -> str | None:
    m = _STEM.match(step)
    return f"{m.group(1)}*" if m and m.group(1) else None


def build(steps: Sequence[tuple[str, str]], edges: list[tuple[str, str]] | None,
          expand: frozenset[str] = frozenset()) -> Graph:
    """``steps``: (name, state) in the flow's order. Numbered siblings (``shard_0``..``shard_99``)
    fold into one node when the run is large, unless their group is in ``expand``."""
    names = [s for s, _ in steps]
    state = dict(steps)
    ups: dict[str, list[str]] = {s: [] for s in names}
    for a, b in edges or []:
        ups[b].append(a)
    layer: dict[str, int] = {}
    for i, s in enumerate(names):  # topological order: ups come first
        layer[s] = (max((layer[u] for u in ups[s]), default=-1) + 1) if edges is not None else i
    groups: dict[str, list[str]] = {}
    if len(names) > COLLAPSE_OVER:
        for s in names:
            g = group_of(s)
            if g is not None:
                groups.setdefault(f"{g}@{layer[s] if edges is not None else 0}", []).append(s)
    folded = {k: v for k, v in groups.items() if len(v) >= COLLAPSE_AT and k.split("@")[0] not in expand}
    node_of: dict[str, Node] = {}
    nodes: list[Node] = []
    for s in names:
        key = next((k for k, v in folded.items() if s in v), None)
        if key is not None:
            if key in node_of:
                node_of[s] = node_of[key]
                continue
            members = folded[key]
            counts: dict[str, int] = {}
            for m in members:
                counts[state[m]] = counts.get(state[m], 0) + 1
            cls = next((p for p in _PRIORITY if p in counts), "PENDING")
            name = key.split("@")[0]
            n = Node(id=f"g-{name}", label=f"{name} ×{len(members)}", state=cls, members=list(members),
                     counts=counts, layer=layer[s], group=name)
            node_of[key] = n
        else:
            n = Node(id=f"s-{s}", label=s, state=state[s], members=[s], layer=layer[s])
        node_of[s] = n
        nodes.append(n)
    if edges is None:  # in order, left to right, a new line every 6
        for i, n in enumerate(nodes):
            n.layer, n.row = i % 6, i // 6
    else:
        rows: dict[int, int] = {}
        for n in nodes:
            n.row = rows.get(n.layer, 0)
            rows[n.layer] = n.row + 1
    for n in nodes:
        n.x = PAD + n.layer * (NODE_W + GAP_X)
        n.y = PAD + n.row * (NODE_H + GAP_Y)
    pairs: list[tuple[Node, Node]] = []
    seen: set[tuple[str, str]] = set()
    for a, b in edges or []:
        na, nb = node_of[a], node_of[b]
        if na is not nb and (na.id, nb.id) not in seen:
            seen.add((na.id, nb.id))
            pairs.append((na, nb))
    width = PAD * 2 + (max((n.layer for n in nodes), default=0) + 1) * (NODE_W + GAP_X) - GAP_X
    height = PAD * 2 + (max((n.row for n in nodes), default=0) + 1) * (NODE_H + GAP_Y) - GAP_Y
    return Graph(nodes=nodes, edges=pairs, has_edges=edges is not None, width=width, height=height,
                 groups={k.split("@")[0]: v for k, v in folded.items()})
