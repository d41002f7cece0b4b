"""A beanstalkd client in a second language: Node.js's ``beanstalkd`` package (tests/node,
installed by scripts/test) puts, reserves, buries, kicks and deletes through
``blizzard beanstalkd`` on a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

from blizzard import Client
from blizzard.gateways.beanstalkd import BeanstalkdGateway, GatewayConfig

pytestmark = pytest.mark.cluster
SCRIPT = os.path.join(os.path.dirname(__file__), "node", "beanstalk_client.js")


def test_a_node_client_puts_reserves_buries_kicks_and_deletes(cluster_factory):
    assert os.path.isdir(os.path.join(os.path.dirname(SCRIPT), "node_modules")), \
        "tests/node is not installed: scripts/test installs it (npm ci --prefix tests/node)"
    cluster = cluster_factory(datanodes=2, replication=2)
    gw = BeanstalkdGateway(GatewayConfig(cluster.master_addr, "127.0.0.1", 0, admin=True))
    thread = threading.Thread(target=gw.serve_forever, daemon=True)
    thread.start()
    try:
        out = subprocess.run(["node", SCRIPT, str(gw.port)], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        assert seen["reserved"] == {"id": seen["put"], "body": "from node"}
        assert seen["kicked"] == 1
        assert seen["again"] == {"id": seen["put"], "body": "from node"}
        assert seen["empty"] is True
        with Client(cluster.master_addr, timeout_s=10) as native:
            stats = native.stats("node-jobs")
            assert stats["ready"] == stats["leased"] == stats["dead"] == 0  # deleted for good
    finally:
        gw.stop()
        thread.join(10)
