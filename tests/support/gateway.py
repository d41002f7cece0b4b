"""``blizzard beanstalkd`` and ``blizzard sqs`` as processes of their own, for the tests that
need the real commands."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

from blizzard.gateways.beanstalkd import BeanstalkdGateway, GatewayConfig
from blizzard.net import keys as k

from support.cli import BLIZZARD


def gateway_process(master: str, port: int, *args: str, kind: str = "beanstalkd",
                    secure: bool = False, **popen: Any) -> subprocess.Popen[bytes]:
    """``blizzard KIND --listen 127.0.0.1:PORT ARGS`` for the cluster at ``master`` (insecure
    unless ``secure``: then with this process's key directory)."""
    env = dict(os.environ, BLIZZARD_MASTER=master)
    if not secure:
        env.pop(k.ENV, None)
    return subprocess.Popen([*BLIZZARD, kind, "--listen", f"127.0.0.1:{port}", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def beanstalkd_on_new_cluster(cluster_factory: Any, monkeypatch: Any,
                              **config: Any) -> Iterator[BeanstalkdGateway]:
    """A fixture's body: a beanstalkd gateway in a thread in front of a new insecure cluster
    of two data nodes; stopped after the test. ``config``: more ``GatewayConfig`` fields."""
    monkeypatch.delenv(k.ENV, raising=False)
    cluster = cluster_factory(datanodes=2, replication=2, keys=None)
    gw = BeanstalkdGateway(GatewayConfig(cluster.master_addr, "127.0.0.1", 0, **config))
    thread = threading.Thread(target=gw.serve_forever, daemon=True)
    thread.start()
    gw.cluster = cluster  # type: ignore[attr-defined]
    yield gw
    gw.stop()
    thread.join(10)
