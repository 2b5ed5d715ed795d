"""A real S3-protocol server on loopback for the object-store tests: moto's standalone server on
127.0.0.1, a bucket per test with the AWS environment pointing at a fault-injecting proxy in front
of the server (fixtures ``moto_server`` and ``s3`` in conftest.py)."""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Tuple

import pytest

from .faultproxy import FaultProxy

_buckets = itertools.count()

# Short timeouts and backoffs so fault tests run in seconds; few retries so "faults on every
# try" gives up quickly.
TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "AKIDTOKSHUFTEST0001",
    "AWS_SECRET_ACCESS_KEY": "tokshuf-test-secret-never-printed",
    "AWS_REGION": "us-east-1",
    "TOKSHUF_REMOTE_TIMEOUT": "1",
    "TOKSHUF_REMOTE_BACKOFF": "0.01",
    "TOKSHUF_REMOTE_RETRIES": "4",
    "TOKSHUF_REMOTE_PART_SIZE": str(5 << 20),
}


@contextlib.contextmanager
def moto_server() -> Iterator[Tuple[str, int]]:
    """moto's standalone S3 server on 127.0.0.1 (a free port): yields (host, port)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield server.get_host_and_port()
    finally:
        server.stop()


@dataclass
class S3:
    """One test's bucket on the loopback server, a boto3 client talking to the server
    directly (to inspect what tokshuf left), and the fault proxy tokshuf talks through."""

    bucket: str
    client: Any
    proxy: FaultProxy
    direct: str

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        return self.url(key)

    def put_many(self, keys: List[str], data: bytes) -> None:
        """Many small objects at once: straight into the in-process server's store when moto
        allows (a thousand PUTs over HTTP take seconds), else one by one."""
        try:
            from moto.core import DEFAULT_ACCOUNT_ID
            from moto.s3.models import s3_backends

            backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
            for k in keys:
                backend.put_object(self.bucket, k, data)
        except (ImportError, KeyError, AttributeError, TypeError):
            for k in keys:
                self.put(k, data)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def keys(self, prefix: str = "") -> List[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def pending_uploads(self) -> List[str]:
        got = self.client.list_multipart_uploads(Bucket=self.bucket)
        return [u["Key"] for u in got.get("Uploads", [])]

    def faults(self, **kw: Any) -> FaultProxy:
        """Set the proxy's fault schedule (see FaultProxy.configure)."""
        self.proxy.configure(**kw)
        return self.proxy

    def no_faults(self) -> None:
        self.proxy.configure()


@contextlib.contextmanager
def bucket(server: Tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    """A fresh bucket on ``server``, the test's AWS environment, and the proxy in front."""
    with _bucket(server, monkeypatch.setenv, lambda k: monkeypatch.delenv(k, raising=False)) as b:
        yield b


@contextlib.contextmanager
def shared_bucket(server: Tuple[str, int]) -> Iterator[S3]:
    """``bucket`` for a whole module: the environment is set in ``os.environ`` itself (so that
    processes started meanwhile, such as Ray's nodes, inherit it) and restored after."""
    saved = dict(os.environ)

    def setenv(k: str, v: str) -> None:
        os.environ[k] = v

    try:
        with _bucket(server, setenv, lambda k: os.environ.pop(k, None)) as b:
            yield b
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _bucket(server: Tuple[str, int], setenv: Callable[[str, str], None], delenv: Callable[[str], None]) -> Iterator[S3]:
    import boto3

    host, port = server
    direct = f"http://{host}:{port}"
    for k, v in TEST_ENV.items():
        setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3"):
        delenv(k)
    client = boto3.client(
        "s3",
        endpoint_url=direct,
        region_name="us-east-1",
        aws_access_key_id=TEST_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=TEST_ENV["AWS_SECRET_ACCESS_KEY"],
    )
    name = f"tokshuf-test-{next(_buckets)}"
    client.create_bucket(Bucket=name)
    with FaultProxy((host, port)) as proxy:
        setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        yield S3(bucket=name, client=client, proxy=proxy, direct=direct)


def every_get(method: str, target: str) -> bool:
    return method == "GET" and "list-type" not in target


def uploads(method: str, target: str) -> bool:
    """Requests that write: PUT object/part, POST create/complete multipart."""
    return method in ("PUT", "POST")


def parts_only(method: str, target: str) -> bool:
    return method == "PUT" and "partNumber=" in target
