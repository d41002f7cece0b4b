"""Write hedges: an enqueue is acknowledged to the caller only once it is committed (P1), also
when the master's ``PutAlso`` reaches the client on its slow path
(``EnqueuePipeline._enqueue_slowly``, the resend after the enqueue's reply was overdue), which
once took a ``PutAlso`` for success (found in review)."""

from __future__ import annotations

import signal
import threading

import pytest

from blizzard.client.core import Client
from blizzard.wire import protocol as p

from support.sends import kinds, watch_sends
from support.wait import wait_for

pytestmark = pytest.mark.cluster


def test_an_enqueue_answered_put_also_on_its_retry_is_not_acknowledged(cluster_factory,
                                                                      monkeypatch):
    # Given four nodes, R = W = 3, and a producer holding a block of ids on three of them
    cluster = cluster_factory(datanodes=4, replication=3, heartbeat_s=0.2, dead_after_s=8,
                              master_args=["--suspect-after-s", "7"])
    sent = watch_sends(monkeypatch)
    with Client(cluster.master_addr, node_timeout_s=0.3, timeout_s=30) as c:
        c.enqueue("jobs", b"warm-up")
        assert c.pipeline.block is not None
        placed = {ref.addr for ref in c.pipeline.block.placement.nodes}
        slow = next(n for n in cluster.nodes if n.addr in placed)
        # When one placed node stops, and the master stalls past the enqueue's reply time (the
        # client resends it the slow way; the master then answers that resend PutAlso)
        slow.signal(signal.SIGSTOP)
        cluster.master.signal(signal.SIGSTOP)
        before, out = kinds(sent)["Enqueue"], {}

        def produce():
            try:
                out["id"] = c.enqueue("jobs", b"must-not-be-lost")
            except Exception as exc:  # noqa: BLE001 (a failure is a fine outcome here)
                out["error"] = exc
        producer = threading.Thread(target=produce)
        producer.start()
        try:
            wait_for(lambda: kinds(sent)["Enqueue"] >= before + 2, timeout_s=15,
                     what="the enqueue resent the slow way")
        finally:
            cluster.master.signal(signal.SIGCONT)
        producer.join(30)
        slow.signal(signal.SIGCONT)
        assert not producer.is_alive()
        # Then an id handed back to the caller is an item of the queue (else it had to fail)
        if "id" in out:
            with Client(cluster.master_addr, admin=True) as admin:
                def listed() -> bool:
                    return out["id"] in admin.master.call(p.Peek("jobs", 100)).ids
                wait_for(listed, timeout_s=10,
                         what=f"item {out['id']}, acknowledged to the producer, in the queue")
