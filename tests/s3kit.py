"""Buckets on the loopback S3 API server of the ``s3_endpoint`` fixture (tests/conftest.py).

A module of its own, not conftest: ``from conftest import`` would find whichever
directory's conftest was imported first.
"""

from __future__ import annotations


def s3_bucket(endpoint: str) -> tuple[str, dict[str, str]]:
    """A fresh bucket on ``endpoint``: its name, and the environment a segue process
    needs to reach it (as a user would set for any S3-compatible server)."""
    import uuid

    import boto3

    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
    bucket = f"segue-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=bucket)
    return bucket, env
