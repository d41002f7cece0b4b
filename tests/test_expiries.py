"""Lease expiries: one entry per lease record; what is due, by deadline then id, each id once."""

from __future__ import annotations

from master.state.expiries import Expiries
from master.state.machine import State
from master.state.records import CommitItems, LeaseItems


def test_a_record_s_items_come_due_together_and_stale_ones_are_skipped():
    e = Expiries()
    e.add(5.0, [3, 1, 2], [10, 11, 12])
    e.add(2.0, [7], [13])
    e.add(9.0, [], [])  # nothing leased: no entry
    assert len(e) == 2
    held = {1: (11, 5.0), 2: (99, 5.0), 3: (10, 5.0), 7: (13, 2.0)}  # 2: leased again since
    assert e.due(1.9, held, 100) == []
    assert e.due(5.0, held, 100) == [7, 1, 3]
    assert len(e) == 0


def test_past_the_limit_the_rest_of_a_record_waits_for_the_next_call():
    e = Expiries()
    e.add(1.0, [1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    held = {i: (i, 1.0) for i in range(1, 6)}
    assert e.due(2.0, held, 2) == [1, 2]
    for i in (1, 2):
        del held[i]  # released
    assert e.due(2.0, held, 2) == [3, 4]
    assert e.due(2.0, held, 2) == [5]  # each is reported once, released or not
    assert len(e) == 0


def test_a_lease_extended_twice_to_the_same_deadline_expires_once():
    # Given an item whose lease was extended twice in one pass (the same "now")
    s = State()
    s.apply(CommitItems(queue="q", ids=[1], sizes=[1], crcs=[0], priorities=[0],
                        not_befores=[0.0], keys=[""], coalesce=False, nodes=["dn-a"], at=0.0,
                        request=""))
    s.apply(LeaseItems(ids=[1], leases=[1], deadline=10.0, request="r"))
    for _ in range(2):
        s.apply(LeaseItems(ids=[1], leases=[1], deadline=30.0, request=""))
    # When its lease runs out, Then it is reported once (a release of it twice would break
    # the queue's counts)
    assert s.expired(10.0) == []
    assert s.expired(30.0) == [1]


def test_an_entry_whose_leases_were_all_settled_goes_before_its_deadline():
    e = Expiries()
    e.add(100.0, [1, 2], [1, 2])
    e.add(200.0, [3], [3])
    held = {2: (2, 100.0), 3: (3, 200.0)}  # 1 acked
    assert e.due(50.0, held, 100) == [] and len(e) == 2  # 2 still held: its entry stays
    del held[2]
    assert e.due(50.0, held, 100) == [] and len(e) == 1  # all of it acked: gone, not due yet
    assert e.due(200.0, held, 100) == [3] and len(e) == 0
