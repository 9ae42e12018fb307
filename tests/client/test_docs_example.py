"""The runnable example of docs/api.md runs as written (in a subprocess, from the repository root)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_api_doc_example_runs(tmp_path: Path, _test_pool: Path) -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("## A runnable example", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "docs/api.md lost its runnable example"
    script = tmp_path / "example.py"
    script.write_text(code.group(1))
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SEGUE_POOL": str(_test_pool), "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[1] == "RUNNING"
    assert lines[1].startswith("SUCCEEDED {")  # the state and the report's value
    assert any("PAUSED" in x for x in lines[2:])  # the events name the pause
