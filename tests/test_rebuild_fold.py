"""A rebuild's pure parts: pages checked and folded into records, their apply, and the
metadata changes a master sends the nodes (``master/nodes/meta_sync.py``)."""

from __future__ import annotations

import pytest

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from master.ha.rebuild_fold import ID_MARGIN, NodeScan, check_node, fold
from master.nodes.meta_sync import MetaSync
from master.state import records
from master.state.item import DELAYED, READY
from master.state.machine import State
from master.state.records import (
    AckItems,
    AddReplicas,
    ClusterCreated,
    CommitItems,
    ConfigureQueue,
    LeaseItems,
    NodeSeen,
    RebuildItems,
    RedriveItems,
    ReleaseItems,
    Reserve,
)


def meta(*ids: int, queue: str = "jobs", attempts: int = 0, origin: str = "",
         priority: int = 0, not_before: float = 0.0, key: str = "") -> p.ItemMeta:
    return p.ItemMeta(list(ids), queue, priority, not_before, key, attempts, origin)


def page(node: str, *metas: p.ItemMeta, id_hi: int = 100, nxt: int | None = None,
         done: bool = True, cluster: str = "c1", sizes=None, crcs=None) -> p.MetaPage:
    ids = [i for m in metas for i in m.ids]
    return p.MetaPage(node, f"tcp://127.0.0.1:{len(node)}", cluster, id_hi, list(metas),
                      sizes if sizes is not None else [3] * len(ids),
                      crcs if crcs is not None else [7] * len(ids),
                      nxt if nxt is not None else (ids[-1] + 1 if ids else 0), done)


def scan(node: str, *metas: p.ItemMeta, **kw) -> NodeScan:
    first = page(node, *metas, **kw)
    s = check_node(first)
    s.take(first)
    return s


def items_of(rebuilt) -> dict[int, tuple]:
    out = {}
    for rec in rebuilt.records:
        if isinstance(rec, RebuildItems):
            for k, item_id in enumerate(rec.ids):
                out[item_id] = (rec.queue, rec.attempts[k], rec.origins[k], tuple(rec.nodes),
                                rec.sizes[k], rec.crcs[k])
    return out


def test_items_held_by_several_nodes_get_all_of_them_and_the_latest_metadata():
    a = scan("dn-a", meta(1, 2), meta(3, queue="jobs.dead", attempts=3, origin="jobs"))
    b = scan("dn-b", meta(1), meta(2, attempts=1), meta(3, attempts=2), id_hi=500)
    rebuilt = fold([a, b], at=1000.0)
    assert rebuilt.records[:4] == [ClusterCreated("c1"), NodeSeen("dn-a", a.addr),
                                   NodeSeen("dn-b", b.addr), Reserve(500 + ID_MARGIN)]
    assert items_of(rebuilt) == {
        1: ("jobs", 0, "", ("dn-a", "dn-b"), 3, 7),
        2: ("jobs", 1, "", ("dn-a", "dn-b"), 3, 7),  # b heard of a delivery a missed
        3: ("jobs.dead", 3, "jobs", ("dn-a", "dn-b"), 3, 7)}
    assert rebuilt.items == 3 and rebuilt.cluster_id == "c1"


def test_a_holder_whose_copy_differs_is_left_out():
    a = scan("dn-a", meta(1), crcs=[7])
    b = scan("dn-b", meta(1), crcs=[8])
    c = scan("dn-c", meta(1), crcs=[7])
    assert items_of(fold([a, b, c], 0.0))[1][3] == ("dn-a", "dn-c")


def test_the_id_high_water_covers_ids_above_every_page():
    assert fold([scan("dn-a", meta(5000), id_hi=5001)], 0.0).id_hi == 5001 + ID_MARGIN
    assert fold([scan("dn-a", id_hi=0)], 0.0).id_hi == 1 + ID_MARGIN  # nothing held


def test_nodes_of_different_clusters_or_none_are_refused():
    with pytest.raises(InvalidArgument, match="different clusters"):
        fold([scan("dn-a", meta(1)), scan("dn-b", meta(2), cluster="c2")], 0.0)
    with pytest.raises(InvalidArgument, match="no cluster id"):
        check_node(page("dn-a", cluster=""))
    with pytest.raises(InvalidArgument):
        fold([], 0.0)


@pytest.mark.parametrize("bad", [
    page("dn-a", meta(5, 4)),  # out of order
    page("dn-a", meta(1), sizes=[1, 2]),  # a size too many
    page("dn-a", meta(1), crcs=[]),
    page("dn-a", meta(1), sizes=[-1]),
    page("dn-a", meta(1), crcs=[2**32]),
    page("dn-a", meta(1, queue="not a queue")),
    page("dn-a", meta(1, priority=2**40)),
    page("dn-a", meta(1), nxt=1),  # ends before its own id
    page("dn-a", meta(1), id_hi=1),  # its high-water below its own id
    page("dn-b", meta(1)),  # another node mid-scan
    page("dn-a", meta(1), cluster="c2"),
    page("dn-a", meta(1), nxt=0, done=False),  # does not move on
], ids=["order", "sizes", "crcs", "size", "crc", "queue", "priority", "next", "id-hi",
        "node", "cluster", "stuck"])
def test_a_bad_page_is_refused_and_adds_nothing(bad):
    s = check_node(page("dn-a", meta(0), nxt=1, done=False))
    s.take(page("dn-a", meta(0), nxt=1, done=False))
    with pytest.raises(InvalidArgument):
        s.take(bad)
    assert list(s.items) == [0] and s.next == 1


def test_rebuilt_items_apply_in_line_and_survive_a_checkpoint():
    state = State()
    rebuilt = fold([scan("dn-a", meta(1, 2, priority=1), meta(3, not_before=2e9),
                         meta(4, queue="jobs.dead", attempts=2, origin="jobs"))], at=50.0)
    for rec in rebuilt.records:
        state.apply(records.unpack(records.pack(rec)))
    assert state.head("jobs", 10, now=100.0) == [1, 2]
    assert state.items[3].status == DELAYED and state.delays[3] == 2e9
    assert (state.items[4].status, state.items[4].attempts, state.origins[4]) == (READY, 2, "jobs")
    assert state.cluster_id == "c1" and state.id_hi == rebuilt.id_hi
    assert State.restore(state.export_parts()).snapshot() == state.snapshot()


def committed(ids: list[int], nodes=("dn-a", "dn-b")) -> State:
    state = State()
    n = len(ids)
    state.apply(ConfigureQueue("jobs", 30.0, 2, "", 0.0, 300.0, 0.0, 0))
    state.apply(CommitItems("jobs", ids, [1] * n, [1] * n, [0] * n, [0.0] * n, [""] * n, False,
                            list(nodes), 1.0, "r"))
    return state


def test_changes_reach_each_holder_once_with_the_current_metadata():
    state = committed([1, 2, 3])
    sync = MetaSync(state)
    for rec in (LeaseItems([1, 2], [11, 12], 100.0, "l"),
                ReleaseItems([1, 2], [0.0, 60.0], "boom"),  # 1 and 2: attempt 1, 2 delayed
                LeaseItems([1], [13], 100.0, "l2"), ReleaseItems([1], [0.0], "again")):
        state.apply(rec)
        sync.saw(rec)  # 1 dies (max attempts 2)
    for node in ("dn-a", "dn-b"):
        assert {tuple(m.ids): (m.queue, m.attempts, m.origin, m.not_before)
                for m in sync.take(node)} == {(1,): ("jobs.dead", 2, "jobs", 0.0),
                                              (2,): ("jobs", 1, "", 60.0)}
        assert sync.take(node) == []
    rec = RedriveItems([1])
    state.apply(rec)
    sync.saw(rec)
    assert [(m.ids, m.queue, m.attempts) for m in sync.take("dn-a")] == [([1], "jobs", 0)]


def test_a_new_replica_hears_of_changed_items_only_and_gone_items_are_skipped():
    state = committed([1, 2, 3], nodes=("dn-a",))
    sync = MetaSync(state)
    for rec in (LeaseItems([1], [11], 100.0, "l"), ReleaseItems([1], [0.0], "x"),
                AddReplicas([1, 2], "dn-c")):
        state.apply(rec)
        sync.saw(rec)
    assert [m.ids for m in sync.take("dn-c")] == [[1]]
    state.apply(AckItems([1]))  # acked before dn-a's heartbeat: nothing to send
    assert sync.take("dn-a") == []


def test_heartbeat_replies_carry_the_changes_of_the_node_that_asked():
    state = committed([1])
    sync = MetaSync(state)
    for rec in (LeaseItems([1], [11], 100.0, "l"), ReleaseItems([1], [0.0], "x")):
        state.apply(rec)
        sync.saw(rec)
    plain = p.HeartbeatReply([], [], False, [], "c1")
    reply = sync.add_to(plain, "dn-a")
    assert [(m.ids, m.attempts) for m in reply.meta] == [([1], 1)]
    assert sync.add_to(plain, "dn-a") == p.replace(reply, meta=[])
