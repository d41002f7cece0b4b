"""Queue semantics end to end: priorities, schedules, keys, retries, dead letters, rate limits."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from blizzard import Client
from blizzard.wire.errors import InvalidArgument, LeaseExpired, QueueExists

from support.wait import wait_for


def datas(msgs) -> list[bytes]:
    return [m.data for m in msgs]


def test_priorities_then_fifo(cluster):
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        c.enqueue_many("p", [b"low1", b"low2"], priority=5)
        c.enqueue("p", b"urgent", priority=-1)
        c.enqueue_many("p", [b"mid1", b"mid2"], priority=0)
        assert datas(c.peek("p", 10)) == [b"urgent", b"mid1", b"mid2", b"low1", b"low2"]
        assert datas(c.dequeue_many("p", 10)) == [b"urgent", b"mid1", b"mid2", b"low1", b"low2"]


def test_scheduled_items_wait_for_their_time(cluster):
    with Client(cluster.master_addr, timeout_s=10) as c:
        c.enqueue("s", b"later", delay_s=0.6)
        c.enqueue("s", b"at a time", not_before=time.time() + 0.3)
        c.enqueue("s", b"now")
        assert c.stats("s")["delayed"] == 2
        assert datas(c.dequeue_many("s", 10)) == [b"now"]
        got = c.dequeue("s", wait_s=5)
        assert got.data == b"at a time"
        assert c.dequeue("s", wait_s=5).data == b"later"


def test_a_key_is_never_leased_twice_at_once(cluster):
    with Client(cluster.master_addr, timeout_s=10) as c:
        c.enqueue_many("k", [b"a1", b"a2"], key="user-a")
        c.enqueue("k", b"b1", key="user-b")
        first = c.dequeue_many("k", 10)
        assert datas(first) == [b"a1", b"b1"]  # a2 waits for a1
        assert c.dequeue_many("k", 10) == []
        first[0].ack()
        assert datas(c.dequeue_many("k", 10)) == [b"a2"]


def test_coalescing_keeps_the_latest_data_and_the_best_priority(cluster):
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        c.enqueue("c", b"other")
        c.enqueue("c", b"v1", key="doc", coalesce=True, priority=1)
        c.enqueue("c", b"v2", key="doc", coalesce=True, priority=3)
        c.enqueue("c", b"v3", key="doc", coalesce=True, priority=2)
        assert c.stats("c")["ready"] == 2
        head = c.peek("c", 10)
        assert [(m.data, m.priority) for m in head] == [(b"other", 0), (b"v3", 1)]  # best kept
        st = wait_for(lambda: (s := c.status()) and sum(n.items for n in s.nodes) == 4 and s,
                      what="replaced blobs to be deleted (2 items x R=2)")
        assert st


def test_nack_retry_backoff_and_dead_letters_with_history(cluster):
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        c.create_queue("r", max_attempts=3, backoff_base_s=0.2, backoff_cap_s=0.3)
        with pytest.raises(QueueExists):
            c.create_queue("r")
        c.enqueue("r", b"poison")
        for attempt in range(3):
            msg = c.dequeue("r", wait_s=5)
            assert msg is not None and msg.attempts == attempt
            msg.nack(error=f"boom {attempt}")
            if attempt < 2:
                assert c.stats("r")["delayed"] == 1  # back-off before it is visible again
        stats = c.stats("r")
        assert (stats["ready"], stats["delayed"], stats["dead"]) == (0, 0, 1)
        dead = c.peek("r.dead")
        assert datas(dead) == [b"poison"] and dead[0].attempts == 3
        assert c.redrive("r") == 1
        again = c.dequeue("r")
        assert again.data == b"poison" and again.attempts == 0
        again.ack()


def test_expired_lease_counts_and_late_ack_is_refused(cluster):
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        c.configure_queue("e", lease_s=0.3)
        c.enqueue("e", b"slow")
        first = c.dequeue("e")  # the queue's default lease
        second = c.dequeue("e", wait_s=5)
        assert second.id == first.id and second.attempts == 1
        with pytest.raises(LeaseExpired):
            first.ack(wait=True)
        second.ack()


def test_rate_limit_is_global_across_consumers(cluster):
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        c.configure_queue("rl", rate_per_s=20.0, burst=5)
        c.enqueue_many("rl", [b"x"] * 200)
    granted: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + 1.5

    def consume() -> None:
        with Client(cluster.master_addr, timeout_s=10) as c:
            while time.monotonic() < stop:
                msgs = c.dequeue_many("rl", 10, wait_s=0.2)
                with lock:
                    granted.extend(time.monotonic() for _ in msgs)
                if msgs:
                    c.ack_many(msgs)

    threads = [threading.Thread(target=consume) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 5 at once, then 20 a second: at most 5 + 20 * 1.5 (+ scheduling slack) in 1.5 s
    assert 20 <= len(granted) <= 5 + 20 * 1.5 + 5


def test_settings_and_semantics_survive_a_master_restart(cluster):
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        c.configure_queue("d", max_attempts=2, rate_per_s=1000.0, lease_s=60.0)
        c.enqueue("d", b"delayed", delay_s=1.0)
        c.enqueue("d", b"failing")
        c.dequeue("d").nack(delay_s=0, error="first")
        c.dequeue("d").nack(delay_s=0, error="second")  # dead now
        held = c.dequeue("d", wait_s=5)  # the delayed one, leased for 60 s
    cluster.master.kill()
    cluster.restart_master()
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        config = c.queue_config("d")
        assert (config["max_attempts"], config["rate_per_s"], config["lease_s"]) == \
            (2, 1000.0, 60.0)
        stats = c.stats("d")
        assert (stats["leased"], stats["dead"]) == (1, 1)
        assert c.peek("d.dead")[0].attempts == 2
        c.ack_many([held])  # its lease survived (else LeaseExpired); its own client is closed


def test_bad_input_is_refused_and_changes_nothing(cluster):
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        c.enqueue("b", b"keep")
        before = c.queue_config("b")
        with pytest.raises(InvalidArgument, match="lease_s"):
            c.dequeue("b", lease_s=-1)
        with pytest.raises(InvalidArgument, match="unknown queue option"):
            c.configure_queue("b", visibility=3)
        with pytest.raises(InvalidArgument, match="max_attempts"):
            c.configure_queue("b", max_attempts=-1)
        with pytest.raises(InvalidArgument, match="max_attempts must be an integer"):
            c.configure_queue("b", max_attempts="ten")
        with pytest.raises(InvalidArgument, match="priority"):
            c.enqueue("b", b"x", priority=1.5)
        with pytest.raises(InvalidArgument, match="coalesce"):
            c.enqueue("b", b"x", coalesce=True)
        with pytest.raises(InvalidArgument, match="delay_s"):
            c.enqueue("b", b"x", delay_s=-2)
        assert c.queue_config("b") == before
        assert c.stats("b")["ready"] == 1


def test_queue_commands_of_the_cli(cluster):
    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "blizzard.cli", *args, "--master",
                              cluster.master_addr], capture_output=True, text=True, timeout=60)
        assert not check or out.returncode == 0, out.stdout + out.stderr
        return out
    assert "max_attempts: 4" in run("queue", "create", "cq", "--max-attempts", "4").stdout
    run("enqueue", "cq", "hello", "--priority", "2")
    run("enqueue", "cq", "first", "--priority", "1", "--key", "k")
    assert run("queue", "peek", "cq", "--n", "2").stdout.splitlines()[0].endswith("first")
    assert "ready: 2" in run("queue", "stats", "cq").stdout
    assert "cq" in run("queue", "list").stdout
    assert "rate_per_s: 5.0" in run("queue", "config", "cq", "--rate-per-s", "5").stdout
    assert "purged 2" in run("queue", "purge", "cq", "--yes").stdout
    assert "redrove 0" in run("queue", "redrive", "cq").stdout
    bad = run("queue", "config", "cq", "--max-attempts", "x", check=False)
    assert bad.returncode == 2 and "max-attempts" in bad.stderr


def test_a_stale_ack_after_another_consumer_acked_is_refused(cluster):
    with Client(cluster.master_addr, timeout_s=10) as a, \
            Client(cluster.master_addr, timeout_s=10) as b:
        a.enqueue("st", b"x")
        first = a.dequeue("st", lease_s=0.3)
        second = b.dequeue("st", lease_s=30, wait_s=5)
        second.ack()
        second.ack()  # a retry of one's own ack is fine
        with pytest.raises(LeaseExpired):
            first.ack(wait=True)


def test_dead_letters_stay_in_the_dead_letter_queue(cluster):
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        c.configure_queue("dl", max_attempts=1)
        c.enqueue("dl", b"x")
        c.dequeue("dl").nack(delay_s=0)
        for _ in range(12):  # more failures than any max_attempts default
            c.dequeue("dl.dead").nack(delay_s=0)
        assert c.stats("dl")["dead"] == 1
        assert [q["queue"] for q in c.queues() if q["ready"]] == ["dl.dead"]
