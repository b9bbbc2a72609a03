"""A real S3-compatible server on 127.0.0.1 for the object-storage tests: moto's server
mode (`moto[server]`, which enforces `If-None-Match` and `If-Match` on PUT), on a free
port, with the standard environment pointing at it."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    env: dict[str, str]  # the whole environment a subprocess needs to reach it

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")

    def bucket(self) -> str:
        """A new empty bucket."""
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        found = self.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        return sorted(item["Key"] for item in found)

    def body(self, bucket: str, key: str) -> bytes:
        return bytes(self.client().get_object(Bucket=bucket, Key=key)["Body"].read())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """moto's server on 127.0.0.1, stopped at the end; the AWS variables set meanwhile."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    variables = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield S3Server(endpoint, dict(os.environ))
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
