"""A retired or expired key stops working at once, on connections already open too.

Real secure clusters with a key directory of their own; clients keep their connections open
across the retirement, as a long-running worker would.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import zmq

from blizzard import Client
from blizzard.net import keys as k
from blizzard.net.transport import Endpoint, call
from blizzard.wire import protocol as p
from blizzard.wire.errors import AuthenticationFailed

from support.wait import wait_for

FAST = dict(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5)


def refused(attempt) -> bool:
    """True once ``attempt()`` raises AuthenticationFailed (False while it works)."""
    try:
        attempt()
    except AuthenticationFailed:
        return True
    return False


def test_a_retired_client_key_stops_working_on_its_open_connection(cluster_factory, tmp_path):
    keys = str(tmp_path / "keys")
    cl = cluster_factory(keys=keys, **FAST)
    old = k.ClientKeys.from_dir(keys)
    k.rotate(keys, "client")
    new = k.ClientKeys.from_dir(keys)
    with Client(cl.master_addr, timeout_s=5, keys=old) as before:
        before.enqueue("r", b"1")  # its connections to the master and the nodes are open
        raw = Endpoint(before.ctx, cl.master_addr, old, old.master)
        try:
            assert isinstance(call(raw, p.Ping(), 5), p.Ok)
            k.retire(keys, "client")
            started = time.monotonic()
            wait_for(lambda: refused(lambda: call(raw, p.Ping(), 5)), timeout_s=5,
                     what="the open connection of the retired key to be refused")
            assert time.monotonic() - started < 3
        finally:
            raw.close()
        with pytest.raises(AuthenticationFailed, match="revoked"):
            before.enqueue("r", b"2")
    with Client(cl.master_addr, timeout_s=5, keys=new) as after:
        got = after.dequeue_many("r", 10, wait_s=1)
        assert [m.data for m in got] == [b"1"]  # nothing of the refused enqueue came in
        after.ack_many(got)


def test_a_rotated_keys_old_half_expires_after_its_grace_period(cluster_factory, tmp_path):
    keys = str(tmp_path / "keys")
    cl = cluster_factory(keys=keys, **FAST)
    old = k.ClientKeys.from_dir(keys)
    k.rotate(keys, "client", grace_s=2.0)
    rotated = time.time()
    listed = subprocess.run([sys.executable, "-m", "blizzard.cli", "keys", "list", keys],
                            capture_output=True, text=True, timeout=30).stdout
    assert "client.old.key" in listed and "valid until" in listed
    ep = Endpoint(zmq.Context.instance(), cl.master_addr, old, old.master)
    try:
        assert isinstance(call(ep, p.Ping(), 5), p.Ok)  # within its grace: still valid
        wait_for(lambda: refused(lambda: call(ep, p.Ping(), 5)), timeout_s=10,
                 what="the old key to expire on its open connection")
        assert time.time() - rotated >= 2.0
    finally:
        ep.close()
    with pytest.raises(AuthenticationFailed):  # and new connections with it are refused
        with Client(cl.master_addr, timeout_s=3, keys=old) as late:
            late.enqueue("r", b"late")
    with Client(cl.master_addr, timeout_s=5, keys=keys) as c:  # the new pair works on
        c.enqueue("r", b"on time")


def test_an_old_key_from_before_grace_periods_expires_a_day_after_its_rotation(tmp_path):
    keys = str(tmp_path / "keys")
    k.generate(keys)
    k.rotate(keys, "client")
    (tmp_path / "keys" / "client.old.expires").unlink()  # rotated by an older version
    end = k.expiry(str(tmp_path / "keys" / "client.old.key"))
    assert abs(end - (time.time() + k.DEFAULT_GRACE_S)) < 60
    assert sorted(k.authorized(keys).values()) == ["admin", "client", "client", "master"]
    with pytest.raises(AuthenticationFailed, match="between 0 and 10 years"):
        k.rotate(keys, "admin", grace_s=-1)


def test_a_retired_keys_parked_long_polls_lease_nothing(cluster_factory, tmp_path):
    """A long poll parked by a key that is then retired must not take the items that come:
    nobody would get them, and they would stay leased for the whole lease."""
    keys = str(tmp_path / "keys")
    cl = cluster_factory(keys=keys, **FAST)
    old = k.ClientKeys.from_dir(keys)
    k.rotate(keys, "client")
    new = k.ClientKeys.from_dir(keys)
    parked = Endpoint(zmq.Context.instance(), cl.master_addr, old, old.master)
    try:
        for i in range(3):  # parked: nothing is there yet
            parked.send(p.Lease("polled", 1, 3600.0, 120.0, f"parked-{i}", [], [], False))
        # answered once the requests before it on the connection are handled: parked
        assert isinstance(call(parked, p.Ping(), 5), p.Ok)
        k.retire(keys, "client")
        with Client(cl.master_addr, timeout_s=5, keys=new) as c:
            started = time.monotonic()
            while not refused(lambda: call(parked, p.Ping(), 1)):  # the master sees it retired
                assert time.monotonic() - started < 5
            c.enqueue_many("polled", [b"a", b"b", b"c"])
            got = c.dequeue_many("polled", 10, wait_s=2)
            assert sorted(m.data for m in got) == [b"a", b"b", b"c"]
            c.ack_many(got)
    finally:
        parked.close()
