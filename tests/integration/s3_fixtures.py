"""A local S3-compatible server (moto) for the s3:// warehouse tests, and settings that use it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

from streams.settings import Secret, Settings

BUCKET = "causeway-test"


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def s3_settings(settings: Settings, endpoint: str, prefix: str, bucket: str = BUCKET) -> Settings:
    """``settings`` writing to ``s3://<bucket>/<prefix>`` on ``endpoint`` (the bucket is created).

    moto keeps its buckets per process, not per server: a test that lists a whole bucket needs its own.
    """
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    ).create_bucket(Bucket=bucket)
    return settings.replace(
        warehouse=f"s3://{bucket}/{prefix}",
        s3_endpoint=endpoint,
        s3_access_key=Secret("k"),
        s3_secret_key=Secret("s"),
        s3_region="us-east-1",
    )
