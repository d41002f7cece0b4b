"""A hot standby master: it follows the WAL, takes over, and the old primary is fenced."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading

import pytest

from blizzard import Client
from blizzard.local.harness import free_port
from blizzard.net.transport import call
from blizzard.wire import protocol as p
from blizzard.wire.errors import BlizzardError, InvalidArgument
from master.config import MasterConfig
from master.ha.standby import StandbyServer
from master.ha.wal_shipping import EXIT_FENCED
from master.log import checkpoint_file
from master.log.wal import list_segments, segment_name

from support.wait import wait_for

FAST = dict(heartbeat_s=0.2, dead_after_s=1.5, datanodes=2)


def wait_synced(cluster) -> None:
    wait_for(lambda: "replies now wait for it" in cluster.master.head(), what="the standby in sync")


def promote(cluster, force: bool = False) -> int:
    endpoint = cluster.endpoint(cluster.second.addr, "admin")
    try:
        return call(endpoint, p.Promote(force), 10).epoch
    finally:
        endpoint.close()


def promote_when_caught_up(cluster) -> int:
    """Promote the standby once it has caught up with its primary (a moment after the
    primary counts it in sync: it sees it has nothing more to receive)."""
    def attempt() -> int | None:
        try:
            return promote(cluster)
        except InvalidArgument:  # not in sync yet
            return None
    return wait_for(attempt, what="the standby to be in sync and promoted")


def log_end(directory: str) -> tuple[int, int] | None:
    """(last segment, its size) of a WAL directory; None while it has none (a standby that
    starts over from a checkpoint empties its log first)."""
    segments = list_segments(directory) if os.path.isdir(directory) else []
    if not segments:
        return None
    try:
        return segments[-1], os.path.getsize(os.path.join(directory, segment_name(segments[-1])))
    except FileNotFoundError:  # removed between the listing and the look
        return None


def drain(client: Client, queue: str = "jobs") -> list[bytes]:
    """Every payload left in ``queue`` (acked)."""
    got: list[bytes] = []
    while msgs := client.dequeue_many(queue, 100, wait_s=0.5):
        got += [m.data for m in msgs]
        client.ack_many(msgs)
    return got


def test_promotion_fences_a_paused_primary_that_wakes_up(cluster_factory):
    cl = cluster_factory(standby=True, **FAST)
    wait_synced(cl)
    with Client(cl.masters, timeout_s=20) as c:
        c.enqueue_many("jobs", [b"a%d" % i for i in range(50)])
    cl.master.signal(signal.SIGSTOP)
    assert promote_when_caught_up(cl) == 1
    with Client(cl.masters, timeout_s=20) as c:  # rides over to the new primary
        c.enqueue_many("jobs", [b"b%d" % i for i in range(50)])
    with Client(cl.master_addr, timeout_s=3) as old:
        cl.master.signal(signal.SIGCONT)
        with pytest.raises(BlizzardError):  # it confirms nothing: its standby is gone
            old.create_queue("stale")  # (needs no data node, which would fail it anyway)
    wait_for(lambda: not cl.master.alive, what="the old primary to learn of epoch 1 and stop")
    assert cl.master.popen.returncode == EXIT_FENCED
    assert "fenced" in cl.master.tail()
    with Client(cl.masters, timeout_s=20) as c:
        assert sorted(drain(c)) == sorted([b"a%d" % i for i in range(50)] +
                                          [b"b%d" % i for i in range(50)])
        assert "stale" not in {q["queue"] for q in c.queues()}


def test_a_killed_primary_fails_over_by_itself_and_loses_nothing_acknowledged(cluster_factory):
    cl = cluster_factory(standby=True, **FAST)
    wait_synced(cl)
    with Client(cl.masters, timeout_s=30) as c:
        c.enqueue_many("jobs", [b"a%d" % i for i in range(200)])
        leased = c.dequeue_many("jobs", 20, lease_s=300)
        c.ack_many(leased[:10])
        cl.master.kill()
        c.enqueue_many("jobs", [b"b%d" % i for i in range(20)])
        c.ack_many(leased[10:])  # leases taken on the old primary are the new one's
        assert "promoted" in wait_for(lambda: "promoted" in cl.second.head() and cl.second.head(),
                                      what="the standby's promotion")
        left = drain(c)
    assert sorted(left) == sorted([b"a%d" % i for i in range(20, 200)] +
                                  [b"b%d" % i for i in range(20)])
    with Client(cl.masters, timeout_s=5) as fresh:  # asks both which is the primary, at once
        assert fresh.master.endpoint.addr == cl.second.addr


def test_nothing_is_confirmed_while_a_sync_standby_is_away(cluster_factory):
    cl = cluster_factory(standby=True, standby_args=["--failover-after-s", "0"], **FAST)
    wait_synced(cl)
    cl.second.signal(signal.SIGSTOP)
    done = threading.Event()

    def produce() -> None:
        with Client(cl.masters, timeout_s=60) as c:
            c.enqueue("jobs", b"late")
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        assert not done.wait(1.5)  # the primary holds the confirmation for its standby
    finally:
        cl.second.signal(signal.SIGCONT)
    assert done.wait(30)
    producer.join()
    cl.master.kill()
    assert promote_when_caught_up(cl) == 1  # in sync, so no --force needed: it has "late"
    with Client(cl.masters, timeout_s=20) as c:
        assert drain(c) == [b"late"]


def test_a_standby_far_behind_starts_over_from_a_checkpoint(cluster_factory):
    cl = cluster_factory(standby=True, master_args=["--no-sync-standby",
                                                    "--checkpoint-records", "5"], **FAST)
    cl.second.signal(signal.SIGSTOP)
    with Client(cl.master_addr, timeout_s=20) as c:
        for i in range(10):
            c.enqueue_many("jobs", [b"%d-%d" % (i, j) for j in range(10)])
    master_wal = f"{cl.base_dir}/master/wal"
    wait_for(lambda: checkpoint_file.list_checkpoints(master_wal),
             what="a checkpoint on the primary")
    cl.second.signal(signal.SIGCONT)
    wait_for(lambda: "receiving the primary's checkpoint" in cl.second.head(),
             what="the standby to start over from the checkpoint")
    with Client(cl.master_addr, timeout_s=20) as c:
        c.enqueue("jobs", b"after")
    wait_for(lambda: log_end(f"{cl.base_dir}/standby/wal") == log_end(master_wal),
             what="the standby to hold the whole log")
    cl.master.kill()
    with pytest.raises(BlizzardError, match="not in sync"):
        promote(cl)  # the primary never waited for it, so it may lack acknowledged writes
    assert promote(cl, force=True) == 1
    with Client(cl.masters, timeout_s=20) as c:
        assert len(drain(c)) == 101


def test_a_restarted_standby_is_not_in_sync_until_it_has_caught_up_again(cluster_factory,
                                                                         tmp_path):
    """Its log names it as the standby in sync, but the primary may have gone on without it
    meanwhile: only reaching the primary's end again makes it safe to take over."""
    cl = cluster_factory(heartbeat_s=0.2, dead_after_s=1.5, datanodes=1, replication=1)
    config = MasterConfig(data_dir=str(tmp_path / "standby"), bind=f"tcp://127.0.0.1:{free_port()}",
                          standby_of=cl.master_addr, keys=cl.keys, replication=1)
    standby = StandbyServer(config)
    try:
        wait_for(lambda: standby.run_once(20) or standby.synced, what="the standby in sync")
    finally:
        standby.close()
    # the same standby (its name is its address) on a fresh port: the old socket may linger
    again = StandbyServer(dataclasses.replace(config, advertise=config.addr,
                                              bind=f"tcp://127.0.0.1:{free_port()}"))
    try:
        assert again.state.standby[0] == config.addr and not again.synced
        wait_for(lambda: again.run_once(20) or again.synced, what="in sync again")
    finally:
        again.close()
