"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from segue_helpers import FLOWS, Segue


@pytest.fixture
def segue(tmp_path: Path) -> Segue:
    return Segue(tmp_path / "home")


@pytest.fixture(scope="session")
def counter_ref(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], dict[str, Any]]:
    """Outputs of uninterrupted runs of the counter flow, by its parameter n (cached)."""
    s = Segue(tmp_path_factory.mktemp("ref") / "home")
    cache: dict[int, dict[str, Any]] = {}

    def ref(n: int) -> dict[str, Any]:
        if n not in cache:
            run = f"ref{n}"
            s("run", str(FLOWS / "counter.py"), "--run-id", run, "-p", f"n={n}", "-p", "sleep=0",
              check=True)
            cache[n] = {"count": s.output(run, "count"), "report": s.output(run, "report")}
        return cache[n]

    return ref
