"""A beanstalkd client in a second language: Node.js's ``beanstalkd`` package (tests/node,
installed by scripts/test) puts, reserves, buries, kicks and deletes through
``blizzard beanstalkd`` on a real cluster, over TCP and over a Unix socket."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading

import pytest

from blizzard import Client
from blizzard.gateways.beanstalkd import BeanstalkdGateway, GatewayConfig

pytestmark = pytest.mark.cluster
SCRIPT = os.path.join(os.path.dirname(__file__), "node", "beanstalk_client.js")


@pytest.mark.parametrize("over", ["tcp", "unix"])
def test_a_node_client_puts_reserves_buries_kicks_and_deletes(cluster_factory, over):
    assert os.path.isdir(os.path.join(os.path.dirname(SCRIPT), "node_modules")), \
        "tests/node is not installed: scripts/test installs it (npm ci --prefix tests/node)"
    cluster = cluster_factory(datanodes=2, replication=2)
    where = tempfile.mkdtemp(prefix="bz-", dir="/tmp")  # (a socket's path is at most 107 bytes)
    path = os.path.join(where, "gw.sock") if over == "unix" else ""
    gw = BeanstalkdGateway(GatewayConfig(cluster.master_addr, "127.0.0.1", 0, admin=True,
                                         listen_path=path))
    thread = threading.Thread(target=gw.serve_forever, daemon=True)
    thread.start()
    try:
        out = subprocess.run(["node", SCRIPT, path or str(gw.port)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        assert seen["reserved"] == {"id": seen["put"], "body": "from node"}
        assert seen["kicked"] == 1
        assert seen["again"] == {"id": seen["put"], "body": "from node"}
        assert seen["empty"] is True
        assert seen["kickedDelayed"] == 1  # none buried: kick makes a delayed job ready
        now = seen["delayedNow"]
        assert (now["id"], now["body"]) == (now["put"], "later")
        assert seen["stats"] == {"puts": 2, "kicks": 2, "draining": False}  # (its YAML, parsed)
        assert seen["tubes"] == ["node-jobs"]
        with Client(cluster.master_addr, timeout_s=10) as native:
            stats = native.stats("node-jobs")
            assert stats["ready"] == stats["leased"] == stats["dead"] == 0  # deleted for good
    finally:
        gw.stop()
        thread.join(10)
        shutil.rmtree(where, ignore_errors=True)
