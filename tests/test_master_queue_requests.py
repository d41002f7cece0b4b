"""The master's queue requests in-process: configure, quiet acks, a queue's oldest age.

The same in-process master as ``test_master_requests.py``: a real ``MasterServer`` over an
in-memory WAL, its requests handled without a cluster.
"""

from __future__ import annotations

import math
import time

import pytest

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument

from support.in_process_master import call, enqueue_msg, in_process_master, place, report


@pytest.fixture
def master():
    server = in_process_master(replication=1, max_item_bytes=1000)
    yield server
    server.close()


def test_a_configure_out_of_bounds_is_refused_and_logs_nothing(master):
    """The client checks settings first, but the master must not rely on it (P7)."""
    unset = dict.fromkeys(p.fields_of(p.Configure)) | {"queue": "q", "create": False}
    call(master, p.Configure(**unset | {"max_attempts": 2}))
    logged = len(master.wal.records)
    before = master.state.config("q")
    for bad in ({"lease_s": 0.0}, {"burst": -1}, {"dead_letter": " spaced "},
                {"backoff_cap_s": math.inf}):
        with pytest.raises(InvalidArgument, match=next(iter(bad))):
            call(master, p.Configure(**unset | bad))
    assert master.state.config("q") == before and before.max_attempts == 2
    assert len(master.wal.records) == logged


def test_a_quiet_ack_is_applied_and_answered_by_nobody(master):
    placement = place(master, 2)
    report(master, placement.ids)
    call(master, enqueue_msg(placement.ids))
    leased = call(master, p.Lease("q", 2, 30.0, 0.0, "l1", [], []))
    assert call(master, p.Ack(leased.ids[:1], leased.leases[:1], True)) is None
    assert call(master, p.Ack(leased.ids[1:], [leased.leases[1] + 99], True)) is None  # stale
    assert leased.ids[0] not in master.state.items and leased.ids[1] in master.state.items
    assert call(master, p.Ping()) == p.Ok()


def test_the_oldest_age_is_the_heads_after_items_before_it_were_leased_and_acked(master):
    placement = place(master, 3)
    report(master, placement.ids)
    call(master, enqueue_msg(placement.ids))
    leased = call(master, p.Lease("q", 1, 30.0, 0.0, "l1", [], []))
    call(master, p.Ack(leased.ids, leased.leases, False))
    time.sleep(0.01)
    stats = call(master, p.Stats("q"))
    assert stats.ready == 2 and stats.oldest_age_s >= 0.01


def test_the_oldest_age_counts_items_waiting_behind_a_leased_key(master):
    placement = place(master, 3)
    report(master, placement.ids)
    call(master, enqueue_msg(placement.ids, keys=["k"] * 3))
    leased = call(master, p.Lease("q", 1, 30.0, 0.0, "l1", [], []))
    assert len(leased.ids) == 1
    assert call(master, p.Lease("q", 1, 30.0, 0.0, "l2", [], [])).ids == []  # the key is busy
    time.sleep(0.01)
    stats = call(master, p.Stats("q"))
    assert stats.ready == 2 and stats.oldest_age_s >= 0.01  # two wait, however busy their key
