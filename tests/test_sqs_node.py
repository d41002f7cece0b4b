"""An SQS SDK in a second language: the AWS SDK for JavaScript v3 (``@aws-sdk/client-sqs``,
pinned in tests/node's lock file, installed by scripts/test) against ``blizzard sqs`` with
SigV4 credentials: send, receive with a long poll, change visibility, batch delete, a FIFO
group in order."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from support.sqs import KEYS, gateway_on_new_cluster

pytestmark = pytest.mark.cluster
SCRIPT = os.path.join(os.path.dirname(__file__), "node", "sqs_client.js")


@pytest.fixture
def gateway(cluster_factory, tmp_path):
    yield from gateway_on_new_cluster(cluster_factory, tmp_path)


def test_the_aws_sdk_for_javascript_sends_receives_and_deletes_through_the_gateway(gateway):
    assert os.path.isdir(os.path.join(os.path.dirname(SCRIPT), "node_modules", "@aws-sdk")), \
        "tests/node is not installed: scripts/test installs it (npm ci --prefix tests/node)"
    out = subprocess.run(["node", SCRIPT, gateway.url, *KEYS["client"]], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    body = "from js \u00e9\u2744"
    assert seen["sentMd5"] == hashlib.md5(body.encode()).hexdigest()  # the SDK checks it too
    assert seen["first"] == {"body": body, "color": "blue", "count": "1"}
    assert seen["again"] == {"body": body, "count": "2"}  # visible again at once, counted
    assert seen["batch"] == ["batch a", "batch b"]
    assert (seen["deleted"], seen["failed"]) == (3, 0)
    assert seen["left"] == {"ApproximateNumberOfMessages": "0",
                            "ApproximateNumberOfMessagesNotVisible": "0"}
    assert seen["fifo"] == ["step 1", "step 2", "step 3"]  # a group in order


def test_the_javascript_sdk_is_refused_with_a_wrong_secret(gateway):
    out = subprocess.run(["node", SCRIPT, gateway.url, KEYS["client"][0], "wrong-secret"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert "SignatureDoesNotMatch" in seen["error"] or "signature" in seen["error"].lower()
    assert seen["seen"] == {}  # nothing was done
