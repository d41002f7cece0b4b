"""Write hedges (``master/produce/enqueue.py``, ``master/produce/placements.py``): a parked enqueue
does not wait on one silent placed node past the hedge delay, also when no node had reported at the
first hedge time (it was tried once only, found in review; now it is looked at again)."""

from __future__ import annotations

import time

from blizzard.net.hedge import CAP_S
from blizzard.wire import protocol as p
from tests.support.in_process_master import (
    call,
    enqueue_msg,
    in_process_master,
    join,
    place,
    report,
    waiting_replies,
)


def test_a_write_is_hedged_once_its_other_nodes_report_after_the_first_hedge_time():
    # Given four data nodes, R = W = 3, and an enqueue parked on a placement of three of them
    master = in_process_master(replication=3)
    for k, node in enumerate(("dn-b", "dn-c", "dn-d"), start=2):
        join(master, node, k)
    placement = place(master, 1)
    ids = placement.ids
    t0 = time.monotonic()
    assert call(master, enqueue_msg(ids, wait_s=5.0)) is None  # parked
    # When no placed node has reported at the hedge time (all three were a little slow: the
    # hedge is rightly not sent then, the hold-up is not one node's) ...
    assert waiting_replies(master, t0 + CAP_S + 0.05) == []
    # ... and then two of them report, the third stays silent
    placed = [ref.node_id for ref in placement.nodes]
    for node in placed[:2]:
        report(master, ids, node)
    replies = []
    for k in range(1, 9):  # the loop's passes over the next second (nodes heartbeating)
        for node in ("dn-a", "dn-b", "dn-c", "dn-d"):
            join(master, node, 1 + ("dn-a", "dn-b", "dn-c", "dn-d").index(node))
        replies += waiting_replies(master, t0 + CAP_S + 0.05 + k * 0.125)
    # Then the write is hedged onto the fourth node within a hedge delay or so, not left to
    # wait out its wait_s (5 s) on the one silent node
    assert any(isinstance(r, p.PutAlso) for r in replies), \
        f"no PutAlso in the second after two of three nodes reported: {replies}"
