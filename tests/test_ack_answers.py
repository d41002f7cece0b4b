"""An ack says what it did: four refusals told apart, the quiet ack's refusals counted.

A durable ack that names an id no item has, an item of another queue, a token the item is
not leased under, or a lease that ran out changes nothing and says which; a quiet ack cannot
answer, so the master counts and logs what it refused (``blizzard_acks_refused``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from itertools import pairwise

import pytest

from blizzard import Client
from blizzard.wire.errors import LeaseExpired, NotInQueue, UnknownItem, WrongLease

BLIZZARD = [sys.executable, "-m", "blizzard.cli"]


@pytest.fixture
def metered(cluster_factory):
    return cluster_factory(datanodes=2, heartbeat_s=0.2, dead_after_s=1.5, metrics=True)


def cli(*args: str, master: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BLIZZARD, *args], capture_output=True, timeout=60,
                          env=dict(os.environ, BLIZZARD_MASTER=master))


def leased_count(c: Client, queue: str) -> int:
    return c.stats(queue)["leased"]


def test_a_durable_ack_tells_the_four_refusals_apart_and_changes_nothing(metered):
    with Client(metered.master_addr) as c:
        c.enqueue("tq2", b"work")
        c.enqueue("other", b"elsewhere")
        msg = c.dequeue("tq2", lease_s=60)
        assert msg is not None
        # An id no item ever had
        with pytest.raises(UnknownItem, match="no such item"):
            c.ack_ids([987654321], [msg.lease], queue="tq2")
        # The right id and token, but the wrong queue: refused, the lease still held
        with pytest.raises(NotInQueue, match="not in queue other"):
            c.ack_ids([msg.id], [msg.lease], queue="other")
        assert leased_count(c, "tq2") == 1
        # A token the item is not leased under, while the lease is held (an older token, and
        # one never handed out)
        for token in (msg.lease ^ 2, msg.lease ^ (1 << 40)):
            with pytest.raises(WrongLease, match="another token"):
                c.ack_ids([msg.id], [token], queue="tq2")
        assert leased_count(c, "tq2") == 1
        # The honest ack still works
        msg.ack(wait=True)
        assert c.stats("tq2")["leased"] == 0 and c.stats("tq2")["ready"] == 0
        # A lease that ran out: the item is back in its queue, and the late ack says so
        c.enqueue("tq2", b"slow")
        late = c.dequeue("tq2", lease_s=0.2)
        assert late is not None
        deadline = time.monotonic() + 15
        while c.stats("tq2")["ready"] != 1:
            assert time.monotonic() < deadline, "the lease never ran out"
            time.sleep(0.05)
        with pytest.raises(LeaseExpired, match="ran out") as err:
            late.ack(wait=True)
        assert type(err.value) is LeaseExpired
        assert c.stats("tq2")["ready"] == 1  # nothing changed


def test_the_cli_ack_reports_each_refusal_and_exits_1(metered):
    m = metered.master_addr
    with Client(m) as c:
        c.enqueue("tq2", b"work")
        msg = c.dequeue("tq2", lease_s=60)
        assert msg is not None
    unknown = cli("ack", "tq2", "987654321", "5", master=m)
    assert unknown.returncode == 1 and b"UnknownItem" in unknown.stderr
    assert b"acked" not in unknown.stdout
    elsewhere = cli("ack", "nosuchqueue", str(msg.id), str(msg.lease), master=m)
    assert elsewhere.returncode == 1 and b"NotInQueue" in elsewhere.stderr
    assert b"not in queue nosuchqueue" in elsewhere.stderr
    wrong = cli("ack", "tq2", str(msg.id), str(msg.lease ^ 2), master=m)
    assert wrong.returncode == 1 and b"WrongLease" in wrong.stderr
    for verb in (["nack"], ["extend", "--lease-s", "30"]):  # they name the queue too
        refused = cli(verb[0], "nosuchqueue", str(msg.id), str(msg.lease), *verb[1:], master=m)
        assert refused.returncode == 1 and b"NotInQueue" in refused.stderr
    done = cli("ack", "tq2", str(msg.id), str(msg.lease), master=m)
    assert done.returncode == 0 and done.stdout == f"acked {msg.id}\n".encode()


def refused_acks(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("blizzard_acks_refused_total{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('reason="')[1].split('"')[0]] = float(value)
    return found


def test_quiet_acks_that_are_refused_are_counted_in_the_metrics_and_logged(metered):
    # every reason is a series from the start, so an alert on it has something to read
    assert set(refused_acks(metered.metrics_url()).values()) == {0.0}
    assert len(refused_acks(metered.metrics_url())) == 4
    with Client(metered.master_addr) as c:
        c.enqueue("quiet", b"x")
        msg = c.dequeue("quiet", lease_s=60)
        assert msg is not None
        class Stale:  # what a consumer acking the wrong ids holds
            def __init__(self, id: int, lease: int, queue: str) -> None:
                self.id, self.lease, self.queue = id, lease, queue

        # sent as ``Message.ack()`` sends: never answered
        c.leases.ack_unawaited([Stale(987654321, 1, "quiet"), Stale(987654322, 1, "quiet"),
                                Stale(msg.id, msg.lease ^ 2, "quiet")])
        c.leases.flush(10)  # applied on the master once this returns
        assert leased_count(c, "quiet") == 1
    zero = {"lease_expired": 0.0, "unknown_id": 0.0, "in_another_queue": 0.0, "wrong_token": 0.0}
    deadline = time.monotonic() + 10
    while refused_acks(metered.metrics_url()) != {**zero, "unknown_id": 2.0, "wrong_token": 1.0}:
        assert time.monotonic() < deadline, refused_acks(metered.metrics_url())
        time.sleep(0.05)
    assert "quiet ack refused for 3 items" in metered.logs()


def test_lease_tokens_cannot_be_guessed_from_ones_own(metered):
    """Another consumer's token is not next to one's own: tokens are 63 random bits, so a
    client cannot ack or extend the items others hold by trying the neighbours of its own."""
    with Client(metered.master_addr) as c:
        c.enqueue_many("guess", [b"%d" % i for i in range(101)])
        mine = c.dequeue_many("guess", 100, lease_s=60)
        (theirs,) = c.dequeue_many("guess", 1, lease_s=60)
        tokens = sorted(m.lease for m in mine)
        assert len(set(tokens)) == 100 and 0 not in tokens
        assert min(b - a for a, b in pairwise(tokens)) > 1_000  # no run, no neighbours
        near = [t + d for t in tokens for d in (-2, -1, 1, 2) if 0 < t + d < 2**63]
        guesses = [t for t in near if t != theirs.lease][:1000]
        with pytest.raises(WrongLease):
            c.ack_ids([theirs.id] * len(guesses), guesses, queue="guess")
        assert c.stats("guess")["leased"] == 101  # nothing was settled by a guess
        c.ack_many([*mine, theirs])
