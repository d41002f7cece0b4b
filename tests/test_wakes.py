"""When an idle server's loop passes again (``master/wakes.py``, ``DatanodeServer.wait_ms``),
and that ``stop`` wakes a loop sleeping long; in process."""

from __future__ import annotations

import threading
import time

import pytest

from blizzard.local.harness import free_port
from blizzard.wire import protocol as p
from datanode.config import DatanodeConfig
from datanode.replica_waits import ReplicaWait
from datanode.server import FORWARD_TIMEOUT_S, DatanodeServer
from datanode.store import MemoryStore
from master import wakes
from master.config import MasterConfig
from master.log.wal import MemoryWal
from master.server import MasterServer
from master.wakes import BUSY_S, IDLE_S

from support.in_process_master import call, enqueue_msg, in_process_master, join, place, report


@pytest.fixture
def master():
    server = in_process_master(replication=1)
    yield server
    server.close()


def sleep_s(master) -> float:
    mono = time.monotonic()
    return master.wakes.next_pass(time.time(), mono) - mono


def test_an_idle_master_sleeps_long_but_notices_a_silent_node_in_time(master):
    assert sleep_s(master) == pytest.approx(IDLE_S)
    quick = in_process_master(replication=1, heartbeat_s=0.2, dead_after_s=1.0)
    try:
        assert sleep_s(quick) == pytest.approx(0.25)
    finally:
        quick.close()


def test_a_lease_running_out_wakes_the_loop_when_it_does(master):
    ids = place(master, 1).ids
    report(master, ids)
    call(master, enqueue_msg(ids))
    call(master, p.Lease("q", 1, 0.3, 0.0, "l1", [], []))
    assert 0.2 < sleep_s(master) <= 0.3


def test_a_long_poll_keeps_the_loop_passing_often(master):
    assert call(master, p.Lease("q", 1, 30.0, 5.0, "l1", [], [])) is None  # parked
    assert sleep_s(master) == pytest.approx(BUSY_S)


@pytest.fixture
def datanode(tmp_path):
    server = DatanodeServer(DatanodeConfig(data_dir=str(tmp_path), heartbeat_s=30.0,
                                           bind=f"tcp://127.0.0.1:{free_port()}"),
                            store=MemoryStore())
    yield server
    server.close()


def test_an_idle_data_node_sleeps_till_its_heartbeat_or_its_oldest_forward(datanode):
    datanode.next_heartbeat = time.monotonic() + 10.0
    assert 9_900 < datanode.wait_ms() <= 10_001
    assert datanode.wait_ms(50) == 50
    first = ReplicaWait(b"client", 1, 2, time.monotonic() + FORWARD_TIMEOUT_S, ["me"])
    later = ReplicaWait(b"client", 2, 2, first.deadline + 1, ["me"])
    datanode.replica_waits.update({7: first, 8: later})
    assert FORWARD_TIMEOUT_S * 1000 - 100 < datanode.wait_ms() <= FORWARD_TIMEOUT_S * 1000 + 1


def stops_at_once(server, loop) -> bool:
    """``loop`` (the server's) runs in a thread; ``stop`` must end it in well under its sleep."""
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    time.sleep(0.2)  # into its sleep (a loop ended before its sleep would pass this test too)
    server.stop()
    thread.join(5.0)
    return not thread.is_alive()


def test_stop_wakes_a_data_node_sleeping_till_its_heartbeat(datanode):
    datanode.next_heartbeat = time.monotonic() + 60.0
    assert stops_at_once(datanode, lambda: datanode.run_once())


def test_stop_wakes_a_master_sleeping_long(tmp_path, monkeypatch):
    monkeypatch.setattr(wakes, "IDLE_S", 60.0)
    server = MasterServer(MasterConfig(data_dir=str(tmp_path), replication=1, dead_after_s=240.0,
                                       bind=f"tcp://127.0.0.1:{free_port()}"), wal=MemoryWal())
    try:
        join(server, "dn-a")  # out of safe mode: it sleeps as an idle master does
        server.tick(time.time(), time.monotonic())
        assert not server.safe_mode.on and server.wakes.next_pass(time.time(), 0.0) > 30
        assert stops_at_once(server, lambda: server.run_once())
    finally:
        server.close()
