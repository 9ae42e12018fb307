"""Shared fixtures for the checkpoint tests: storages to run the contract against."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from segue import _faults
from segue.checkpoint import CheckpointStorage, LocalStorage


# Every backend must pass the same suite; an fsspec backend joins this list.
@pytest.fixture(params=["local"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStorage:
    if request.param == "local":
        return LocalStorage(tmp_path / "root")
    raise AssertionError(request.param)


@pytest.fixture
def faults() -> Iterator[Callable[[str | None], None]]:
    """Arm fault points in-process with ``faults("point:raise")``; disarmed afterwards."""
    yield _faults.rearm
    _faults.rearm("")
