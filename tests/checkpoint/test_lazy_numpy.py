"""NumPy is imported only by states that hold arrays (segue._lazy), and the RNG capture
records NumPy's global generator only when the process imported NumPy; a saved NumPy
state is restored by importing it, so the step continues its draws exactly.

Each case runs in a fresh interpreter: whether NumPy is imported is per process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from segue.run import rng


def _fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_json_state_saves_and_loads_without_importing_numpy(tmp_path: Path) -> None:
    got = _fresh(f"""
import json, sys
from segue.checkpoint import LocalStorage, load, save
from segue.run import rng
st = LocalStorage({str(tmp_path)!r})
state = {{"pos": {{"shard": 3, "offset": 1234}}, "stats": [1, 2.5, "x"], "rng": rng.capture()}}
save(st, "ck1", state)
back = load(st, "ck1").state
rng.restore(back["rng"])
print(json.dumps({{"numpy": "numpy" in sys.modules, "same": back == state, "keys": sorted(back["rng"])}}))
""")
    assert got == {"numpy": False, "same": True, "keys": ["python"]}


def test_a_saved_numpy_rng_state_is_restored_by_importing_numpy(tmp_path: Path) -> None:
    np.random.seed(1234)
    np.random.random(7)
    saved = rng.capture()
    assert "numpy" in saved
    expected = np.random.random(5).tolist()
    path = tmp_path / "rng.json"
    path.write_text(json.dumps(saved))
    got = _fresh(f"""
import json, sys
from segue.run import rng
before = "numpy" in sys.modules
rng.restore(json.load(open({str(path)!r})))
import numpy as np
print(json.dumps({{"before": before, "draws": np.random.random(5).tolist()}}))
""")
    assert got == {"before": False, "draws": expected}


def test_arrays_still_round_trip_once_numpy_is_first_used(tmp_path: Path) -> None:
    got = _fresh(f"""
import json, sys
from segue.checkpoint import LocalStorage, load, save
st = LocalStorage({str(tmp_path)!r})
import numpy as np
a = np.arange(12, dtype=np.float32).reshape(3, 4)
save(st, "ck", {{"w": a, "s": np.float64(2.5), "g": np.random.default_rng(7)}})
back = load(st, "ck").state
print(json.dumps({{"eq": bool((back["w"] == a).all()), "dtype": str(back["w"].dtype),
                   "s": float(back["s"]), "g": float(back["g"].random())}}))
""")
    assert got == {"eq": True, "dtype": "float32", "s": 2.5, "g": float(np.random.default_rng(7).random())}
