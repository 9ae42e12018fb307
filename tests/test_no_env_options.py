"""No option reaches segue's own processes through ``os.environ`` (issue 36).

segue never sets a variable for itself: the store, the host's name, the pool and
the devices an attempt was placed on are passed explicitly (a controller's
command line and stdin, the worker's options record: segue.run.worker_options).
A process sets only what another tool reads at start-up (CUDA's device list,
torch.distributed's rank variables, an offline switch) in its own environment.
And the controller-to-worker variables of old are read nowhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "segue"

# (module, variable) a process may set in its own environment, for another tool.
ALLOWED = {
    ("data/subworker.py", "CUDA_VISIBLE_DEVICES"),
    ("run/gang_rank.py", "CUDA_VISIBLE_DEVICES"),
    ("run/gang_rank.py", "RANK"), ("run/gang_rank.py", "LOCAL_RANK"), ("run/gang_rank.py", "WORLD_SIZE"),
    ("run/gang_rank.py", "LOCAL_WORLD_SIZE"), ("run/gang_rank.py", "MASTER_ADDR"),
    ("run/gang_rank.py", "MASTER_PORT"),
    ("inference/handlers/sbert.py", "HF_HUB_OFFLINE"),
}
# What controllers once exported to their workers: no module may read these any more.
GONE = ("SEGUE_POOL_HOME", "SEGUE_POOL_DEVICES", "SEGUE_DEVICES", "SEGUE_RAY_ATTEMPT", "SEGUE_RAY_WARM",
        '"SEGUE_HOST"')


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _keys(node: ast.AST) -> list[str]:
    """The literal names a write to the environment sets ("?" where not a literal)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Dict):
        return [k.value if isinstance(k, ast.Constant) else "?" for k in node.keys if k is not None]
    return ["?"]


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and _is_environ(t.value):
                    out += [(node.lineno, k) for k in _keys(t.slice)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if _is_environ(f.value) and f.attr in ("update", "setdefault", "__setitem__"):
                args = node.args[:1] or [ast.Dict(keys=[ast.Constant(k.arg) for k in node.keywords],
                                                  values=[])]
                out += [(node.lineno, k) for a in args for k in _keys(a)]
            elif isinstance(f.value, ast.Name) and f.value.id == "os" and f.attr in ("putenv", "unsetenv"):
                out.append((node.lineno, f"os.{f.attr}"))
    return out


def test_segue_sets_no_environment_variable_for_itself() -> None:
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for line, key in _writes(ast.parse(path.read_text(), str(path))):
            if (rel, key) not in ALLOWED:
                bad.append(f"{rel}:{line} sets {key}")
    assert not bad, "pass the option explicitly instead:\n" + "\n".join(bad)


def test_the_old_controller_to_worker_variables_are_read_nowhere() -> None:
    bad = [f"{p.relative_to(SRC)}: {name}" for p in sorted(SRC.rglob("*.py"))
           for name in GONE if name in p.read_text()]
    assert not bad, bad


def test_the_checker_sees_writes() -> None:
    code = ('import os\nos.environ["SEGUE_X"] = "1"\nos.environ.update({"SEGUE_Y": "2"})\n'
            'os.environ.setdefault("SEGUE_Z", "3")\nos.environ.update(SEGUE_W="4")\nos.putenv("A", "b")\n')
    assert [k for _, k in _writes(ast.parse(code))] == ["SEGUE_X", "SEGUE_Y", "SEGUE_Z", "SEGUE_W", "os.putenv"]


def test_the_worker_options_record_round_trips_and_refuses_another_version() -> None:
    import json
    import re

    import pytest

    from segue.errors import SegueError
    from segue.executor.ray_attempt import RayAttempt
    from segue.run.worker_options import WorkerOptions

    opts = WorkerOptions(store="postgresql://u:pw@db/segue", host="B", devices=(2, 3), pool="/p/pool.db",
                         pool_home="/h", pool_host="B",
                         ray=RayAttempt(address="10.0.0.1:6379", node_id="n1", flow_file="/f/flow.py",
                                        gpus=(0,), warm=("a-m0",)))
    assert WorkerOptions.from_json(json.loads(json.dumps(opts.to_json()))) == opts
    assert WorkerOptions.from_json(WorkerOptions().to_json()) == WorkerOptions()
    with pytest.raises(SegueError, match=re.escape("worker options record version 2 is not 1; the controller "
                                                   "and the worker run different segue versions")):
        WorkerOptions.from_json({"v": 2})
