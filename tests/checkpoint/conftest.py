"""Shared fixtures for the checkpoint tests: storages to run the contract against.

Every backend passes the same suite: the local directory, fsspec's in-memory
filesystem, and S3 through s3fs against a real S3 API server (moto) that
tests/conftest.py starts on loopback (``s3_endpoint``) and stops at the end of
the session.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from segue import _faults
from segue.checkpoint import CheckpointStorage, FsspecStorage, LocalStorage


def s3_storage(endpoint: str) -> FsspecStorage:
    import boto3

    bucket = f"segue-{uuid.uuid4().hex[:12]}"
    opts: dict[str, Any] = {
        "key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint,
                                                                 "region_name": "us-east-1"},
        "use_listings_cache": False, "skip_instance_cache": True,
    }
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    return FsspecStorage(f"s3://{bucket}/root", **opts)


# Every backend must pass the same suite.
@pytest.fixture(params=["local", "memory", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStorage:
    if request.param == "local":
        return LocalStorage(tmp_path / "root")
    if request.param == "memory":
        return FsspecStorage(f"memory://segue-{uuid.uuid4().hex}/root")
    return s3_storage(request.getfixturevalue("s3_endpoint"))


@pytest.fixture
def faults() -> Iterator[Callable[[str | None], None]]:
    """Arm fault points in-process with ``faults("point:raise")``; disarmed afterwards."""
    yield _faults.rearm
    _faults.rearm("")
