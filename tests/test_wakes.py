"""When an idle master's loop passes again (``master/wakes.py``), in process."""

from __future__ import annotations

import time

import pytest

from blizzard import protocol as p
from master.wakes import BUSY_S, IDLE_S
from test_master_requests import call, enqueue_msg, in_process_master, place, report


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
