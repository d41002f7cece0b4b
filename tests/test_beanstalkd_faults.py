"""``blizzard beanstalkd`` through faults: a kill -9 of a data node and of the master during a
greenstalk producer/consumer loop loses no job that was answered ``INSERTED``."""

from __future__ import annotations

import threading
import time

import greenstalk
import pytest

from blizzard.gateways.beanstalkd import BeanstalkdGateway, GatewayConfig

from support.wait import wait_for

pytestmark = pytest.mark.cluster
JOBS = 600


def test_no_inserted_job_is_lost_across_a_node_kill_and_a_master_kill(cluster_factory):
    cluster = cluster_factory(datanodes=3, replication=2, heartbeat_s=0.2, dead_after_s=1.5)
    gw = BeanstalkdGateway(GatewayConfig(cluster.master_addr, "127.0.0.1", 0, timeout_s=60))
    threading.Thread(target=gw.serve_forever, daemon=True).start()
    inserted: list[bytes] = []
    deleted: set[bytes] = set()
    producing = threading.Event()
    errors: list[str] = []

    def connect() -> greenstalk.Client:
        return greenstalk.Client(("127.0.0.1", gw.port), encoding=None, use="f", watch="f")

    def produce() -> None:
        c = connect()
        try:
            for n in range(JOBS):  # bounded: each job until INSERTED, at most 20 tries
                body = f"job-{n}".encode()
                for _ in range(20):
                    try:
                        c.put(body)
                        inserted.append(body)
                        break
                    except (greenstalk.Error, OSError) as exc:
                        errors.append(repr(exc))  # not INSERTED: tried again (at least once)
                        c.close()
                        time.sleep(0.2)
                        c = connect()
        finally:
            producing.clear()
            c.close()

    def consume() -> None:
        c = connect()
        deadline = time.monotonic() + 180
        try:
            while time.monotonic() < deadline:
                try:
                    job = c.reserve(timeout=1)
                    c.delete(job)
                    deleted.add(job.body)
                except greenstalk.TimedOutError:
                    if not producing.is_set() and set(inserted) <= deleted:
                        return
                except (greenstalk.Error, OSError):
                    c.close()
                    time.sleep(0.2)
                    c = connect()
        finally:
            c.close()

    producing.set()
    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(inserted) >= JOBS // 4, timeout_s=60, what="a quarter inserted")
        cluster.nodes[0].kill()  # kill -9 of a data node: the others hold a copy of each job
        at_node_kill = len(inserted)
        wait_for(lambda: len(inserted) >= JOBS // 2, timeout_s=60, what="half inserted")
        cluster.master.kill()  # kill -9 of the master, then it comes back on its WAL
        at_master_kill = len(inserted)
        cluster.restart_master()
        for t in threads:
            t.join(200)
        assert not any(t.is_alive() for t in threads)
        assert len(inserted) == JOBS
        assert at_node_kill < JOBS and at_master_kill < JOBS  # the kills came mid-loop
        lost = set(inserted) - deleted
        assert not lost, f"{len(lost)} jobs answered INSERTED never came back: {sorted(lost)[:5]}"
    finally:
        gw.stop()
