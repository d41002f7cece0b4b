"""The SQS gateway in a test: a ``SqsServer`` in a thread, and boto3 clients of it."""

from __future__ import annotations

import os
import threading
from typing import Any

import boto3
from botocore.config import Config

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
