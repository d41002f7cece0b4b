"""The SQS gateway in a test: a ``SqsServer`` in a thread, and boto3 clients of it."""

from __future__ import annotations

import datetime
import http.client
import os
import threading
from collections.abc import Iterator
from typing import Any
from unittest import mock
from urllib.parse import urlencode

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from blizzard.gateways.sqs import SqsConfig, SqsServer

KEYS = {"client": ("AKIDCLIENT", "client-secret-123"), "admin": ("AKIDADMIN", "admin-secret-456")}


def credentials_file(folder: str) -> str:
    path = os.path.join(folder, "sqs-credentials")
    with open(path, "w") as f:
        f.write("# test keys\n")
        for role, (key_id, secret) in KEYS.items():
            f.write(f"{key_id} {secret} {role}\n")
    os.chmod(path, 0o600)
    return path


class RunningGateway:
    def __init__(self, config: SqsConfig) -> None:
        self.server = SqsServer(config)
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def boto(url: str, role: str = "admin", key: tuple[str, str] | None = None, **config: Any) -> Any:
    key_id, secret = key or KEYS[role]
    return boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key_id, aws_secret_access_key=secret,
                        config=Config(retries={"max_attempts": 0}, **config))


def gateway_on_new_cluster(cluster_factory: Any, tmp_path: Any, **config: Any
                           ) -> Iterator[RunningGateway]:
    """A fixture's body: an SQS gateway (admin, the test keys) in front of a new cluster of
    two data nodes; stopped after the test. ``config``: more ``SqsConfig`` fields."""
    cluster = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5)
    gw = RunningGateway(SqsConfig(cluster.master_addr, "127.0.0.1", 0,
                                  credentials=credentials_file(str(tmp_path)), admin=True,
                                  **config))
    gw.cluster = cluster  # type: ignore[attr-defined]
    yield gw
    gw.stop()


def code(exc: ClientError) -> str:
    """The SQS error code of a boto3 ``ClientError``."""
    return exc.response["Error"]["Code"]


def signed(gw: RunningGateway, params: dict, role: str = "admin", secret: str | None = None,
           path: str = "/", when: float | None = None) -> tuple[int, bytes]:
    """A query protocol request (a form) POSTed to ``path``, signed as botocore signs it (at
    ``when``: a request captured then); (status, body)."""
    key_id, real = KEYS[role]
    req = AWSRequest(method="POST", url=gw.url + path, data=urlencode(params),
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    auth = SigV4Auth(Credentials(key_id, secret or real), "sqs", "us-east-1")
    if when is None:
        auth.add_auth(req)
    else:
        then = datetime.datetime.fromtimestamp(when, datetime.UTC)
        with mock.patch("botocore.auth.get_current_datetime", lambda: then):
            auth.add_auth(req)
    prepared = req.prepare()
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        conn.request("POST", path, body=prepared.body, headers=dict(prepared.headers))
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()
