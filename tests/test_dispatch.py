"""HTTP push delivery: tasks, ``blizzard dispatch`` as a real process, ``blizzard task ID``.

Integration tests run a real cluster, a real dispatcher process and a real local HTTP endpoint
(``http_target.py``) that answers 2xx, 5xx, slowly or by dropping the connection, as each
task's URL asks, and records when each request arrived.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from itertools import pairwise

import pytest

from blizzard import Client
from blizzard.client.http_delivery import HttpTask, bury, lookup, task_counts
from blizzard.local.harness import Proc
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument, LeaseExpired
from master.state import records
from master.state.machine import State
from master.state.records import BuryItems, CommitItems, LeaseItems, ReleaseItems

from support.cli import BLIZZARD, run
from support.http_target import HttpTarget
from support.wait import wait_for

DONE = ("succeeded", "failed")


@pytest.fixture
def target():
    t = HttpTarget().start()
    yield t
    t.stop()


@pytest.fixture
def dispatchers(tmp_path, cluster):
    """Start ``blizzard dispatch`` processes against ``cluster``; all are stopped at teardown."""
    started: list[Proc] = []

    def start(queues: str, *args: str) -> Proc:
        log = str(tmp_path / f"dispatch{len(started)}.log")
        proc = Proc("dispatch", [*BLIZZARD, "dispatch", "--master", cluster.master_addr,
                                 "--queues", queues, *args], log, "").start()
        started.append(proc)
        return proc
    yield start
    for proc in started:
        if proc.alive:  # a dispatcher stops within seconds of SIGTERM, not at the kill
            proc.signal(signal.SIGTERM)
            assert proc.popen.wait(20) == 0, proc.tail()
        print(proc.tail())


def settled(c: Client, ids: list[int], timeout_s: float = 30.0) -> dict[int, dict]:
    """Poll until every task has ended (succeeded or failed); their rows by id."""
    def all_done() -> dict[int, dict] | None:
        rows = {r["id"]: r for r in lookup(c, ids)}
        return rows if all(r["state"] in DONE for r in rows.values()) else None
    return wait_for(all_done, timeout_s, "every task to succeed or fail")


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in pairwise(times)]


# -- tasks, without processes ------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, words", [
    ({"url": "ftp://example.com/x"}, "http:// or https://"),
    ({"url": "http://"}, "with a host"),
    ({"url": "http://a:99999/"}, "does not parse"),
    ({"url": "http://a/ b"}, "spaces"),
    ({"url": "http://a/", "method": "BREW"}, "method 'BREW'"),
    ({"url": "http://a/", "headers": {"Content-Length": "1"}}, "set by the dispatcher"),
    ({"url": "http://a/", "headers": {"X-A": "1\r\nX-B: 2"}}, "without CR, LF"),
    ({"url": "http://a/", "headers": {"bad name": "v"}}, "valid HTTP token"),
    ({"url": "http://a/", "body": b"x" * (4 * 1024 * 1024 + 1)}, "at most 4194304"),
    ({"url": "http://a/", "max_attempts": 0}, "max_attempts"),
    ({"url": "http://a/", "backoff_s": -1}, "backoff_s"),
    ({"url": "http://a/", "timeout_s": 0}, "timeout_s"),
])
def test_a_bad_task_is_refused_naming_its_field(kwargs, words):
    url = kwargs.pop("url")
    with pytest.raises(InvalidArgument, match=words):
        HttpTask.make(url, **kwargs)


def test_a_task_round_trips_and_other_payloads_are_not_tasks():
    task = HttpTask.make("https://example.com/hook?a=1", method="put", headers={"X-Id": "7"},
                     body="héllo", max_attempts=3, backoff_s=0.5, timeout_s=2)
    assert HttpTask.decode(task.encode()) == task and task.method == "PUT"
    for data in (b"", b"plain text", p.dumps({"task": 99}), p.dumps({"task": 1, "url": 5})):
        with pytest.raises(InvalidArgument, match="not a"):
            HttpTask.decode(data)


def test_rate_limited_leases_take_retries_without_a_token():
    # Given a queue of three new items, one of which failed once and is due again
    s = State()
    s.apply(CommitItems("q", [1, 2, 3], [1] * 3, [0] * 3, [0] * 3, [0.0] * 3, [""] * 3, False,
                        ["n"], 0.0, ""))
    s.apply(LeaseItems([2], [1], 100.0, ""))
    s.apply(ReleaseItems([2], [0.0], "HTTP 503"))
    # When a lease finds no token left, the retry still goes; new items wait for tokens
    assert s.head("q", 10, 1.0, new=0) == [2]
    assert s.head("q", 10, 1.0, new=1) == [1, 2]
    assert s.head("q", 10, 1.0, new=5) == [1, 2, 3]
    assert s.head("q", 10, 1.0) == [1, 2, 3]  # the walk changed nothing


def test_a_buried_item_is_dead_at_once_and_replays_the_same():
    # Given a queue that would allow ten attempts, and one item leased from it
    s = State()
    s.apply(CommitItems("q", [1, 2], [1, 1], [0, 0], [0, 0], [0.0, 0.0], ["", ""], False,
                        ["n"], 0.0, ""))
    s.apply(LeaseItems([1], [1], 100.0, ""))
    # When it is buried, it is in the dead-letter queue with the error, an attempt counted
    s.apply(BuryItems([1], "attempt 1/1: HTTP 410 Gone"))
    item = s.items[1]
    assert (item.queue, item.attempts, s.origins[1], s.errors[1]) == \
        ("q.dead", 1, "q", "attempt 1/1: HTTP 410 Gone")
    # And a checkpoint and a WAL replay rebuild the same state
    assert State.restore(s.export_parts()).snapshot() == s.snapshot()
    replayed = State()
    for rec in (CommitItems("q", [1, 2], [1, 1], [0, 0], [0, 0], [0.0, 0.0], ["", ""], False,
                            ["n"], 0.0, ""), LeaseItems([1], [1], 100.0, ""),
                BuryItems([1], "attempt 1/1: HTTP 410 Gone")):
        replayed.apply(records.unpack(records.pack(rec)))
    assert replayed.snapshot() == s.snapshot()


# -- a real cluster, a real dispatcher, a real endpoint ----------------------------------------


def test_every_task_ends_succeeded_or_dead_each_retry_after_its_backoff(cluster, target,
                                                                       dispatchers):
    m = cluster.master_addr
    plans = {"ok": "succeeded", "503,ok": "succeeded", "drop,ok": "succeeded",
             "500": "failed", "slow:3": "failed", "502,drop,slow:3,ok": "succeeded"}
    with Client(m) as c:
        # Given tasks whose endpoint answers 2xx, 5xx, slowly or drops the connection (POST:
        # aiohttp resends an idempotent request at once when a reused connection drops)
        ids = {c.enqueue_task("emails", url=target.url(f"t{i}", plan), method="POST",
                              headers={"X-Task": str(i)}, body=f"job {i}", max_attempts=4,
                              backoff_s=0.4, timeout_s=1): (f"t{i}", plan)
               for i, plan in enumerate(plans)}
        not_a_task = c.enqueue("emails", b"not a task")
        # When a dispatcher runs
        proc = dispatchers("emails", "--workers", "4", "--lease-s", "5")
        rows = settled(c, [*ids, not_a_task])
        # Then every task ended as its endpoint decided: nothing lost, nothing pending
        for item_id, (key, plan) in ids.items():
            assert rows[item_id]["state"] == plans[plan], (plan, rows[item_id])
            times = target.times(key)
            # each retry came after its back-off (and a timed-out one after its timeout too)
            assert all(g >= 0.4 for g in gaps(times)), (plan, gaps(times))
            assert all(g < 0.4 + 1.0 + 1.5 for g in gaps(times)), (plan, gaps(times))
        assert [len(target.times(ids_key)) for ids_key, _ in ids.values()] == [1, 2, 2, 4, 4, 4]
        assert rows[not_a_task]["state"] == "failed" and "not a task" in rows[not_a_task]["error"]
        first = next(a for a in target.arrivals if a.key == "t0")
        assert (first.method, first.body, first.headers["X-Task"]) == ("POST", b"job 0", "0")
        # each request names its task and attempt, so an endpoint can tell a repeat
        retried = [a.headers for a in target.arrivals if a.key == "t1"]
        assert [(h["X-Blizzard-Task"], h["X-Blizzard-Attempt"]) for h in retried] == \
            [(str(list(ids)[1]), "1"), (str(list(ids)[1]), "2")]
        dead = {plan: rows[i] for i, (_, plan) in ids.items() if plans[plan] == "failed"}
        assert dead["500"]["error"] == \
            "attempt 4/4: HTTP 500 Internal Server Error: t3 answered 500"
        assert dead["slow:3"]["error"] == "attempt 4/4: no reply within 1 s"
        assert dead["500"]["attempts"] == 4 and dead["500"]["queue"] == "emails.dead"
        counts = task_counts(c, "emails")
        assert counts == {"queue": "emails", "queued": 0, "scheduled": 0, "in_flight": 0,
                          "succeeded": 4, "failed": 3}
    # And SIGTERM stops it cleanly with its totals
    proc.signal(signal.SIGTERM)
    assert proc.popen.wait(15) == 0
    assert "dispatched: leased 18, succeeded 4, retried 11, dead 3" in proc.tail()
    # And `blizzard task` and `queue stats --tasks` show the same
    ok_id = next(i for i, (_, plan) in ids.items() if plan == "503,ok")
    failed_id = next(i for i, (_, plan) in ids.items() if plan == "500")
    text = run("task", str(ok_id), str(failed_id), master=m).stdout.decode()
    assert f"task {ok_id}: succeeded" in text and f"task {failed_id}: failed" in text
    assert "last error: attempt 4/4: HTTP 500 Internal Server Error" in text
    doc = json.loads(run("queue", "stats", "emails", "--tasks", "--json", master=m).stdout)
    assert (doc["succeeded"], doc["failed"]) == (4, 3)


def test_retries_do_not_wait_for_the_rate_limit(cluster, target, dispatchers):
    with Client(cluster.master_addr, admin=True) as c:
        # Given a queue that lets one new task out every 2 s
        c.configure_queue("slow", rate_per_s=0.5, burst=1)
        c.enqueue_task("slow", url=target.url("flaky", "503,503,ok"), backoff_s=0.3)
        later = [c.enqueue_task("slow", url=target.url(f"new{i}")) for i in range(2)]
        dispatchers("slow", "--workers", "4")
        wait_for(lambda: len(target.times("flaky")) == 3, 20, "the flaky task's third try")
        # Then its retries came after their back-off, not a token's 2 s
        flaky = gaps(target.times("flaky"))
        assert all(0.3 <= g < 1.5 for g in flaky), flaky
        # And the new tasks still came one per 2 s
        settled(c, later)
        starts = [target.times(f"new{i}")[0] for i in range(2)]
        assert starts[1] - starts[0] >= 1.8


def test_the_rate_limit_holds_over_10_s(cluster, target, dispatchers):
    rate, burst = 20.0, 5
    with Client(cluster.master_addr, admin=True) as c:
        c.configure_queue("paced", rate_per_s=rate, burst=burst)
        c.enqueue_many("paced", [HttpTask.make(target.url(f"p{i}")).encode()
                                 for i in range(burst + 205)])
        dispatchers("paced", "--workers", "16")
        wait_for(lambda: target.count() == burst + 205, 30, "every task to arrive")
    # the first `burst` went at once (the bucket starts full); after that, `rate` a second
    times = sorted(a.at for a in target.arrivals)[burst:]
    measured = (len(times) - 1) / (times[-1] - times[0])
    assert times[-1] - times[0] >= 9.5
    print(f"measured {measured:.2f} tasks/s over {times[-1] - times[0]:.1f} s (limit {rate:g}/s)")
    assert abs(measured - rate) <= 0.1 * rate, measured


def test_a_dispatcher_killed_mid_run_loses_nothing(cluster, target, dispatchers):
    with Client(cluster.master_addr) as c:
        # Given 40 tasks with slow replies and a dispatcher sending 8 at a time
        ids = [c.enqueue_task("thumbnails", url=target.url(f"s{i}", "slow:1"), timeout_s=10)
               for i in range(40)]
        first = dispatchers("thumbnails", "--workers", "8", "--lease-s", "2")
        # When it is killed -9 while requests are in flight
        wait_for(lambda: target.count() >= 12, 20, "requests in flight")
        first.kill()
        in_flight = {r["id"] for r in lookup(c, ids) if r["state"] == "in_flight"}
        assert in_flight  # their leases run out: they come back
        dispatchers("thumbnails", "--workers", "8", "--lease-s", "2")
        # Then every task succeeds (at least once: some were sent twice)
        rows = settled(c, ids, timeout_s=60)
        assert all(r["state"] == "succeeded" for r in rows.values()), rows
        assert target.keys() == {f"s{i}" for i in range(40)}


def test_sigterm_finishes_the_requests_in_flight_and_acks_them(cluster, target, dispatchers):
    with Client(cluster.master_addr) as c:
        # Given six slow tasks, four senders: four in flight, two leased and waiting
        ids = [c.enqueue_task("slowq", url=target.url(f"g{i}", "slow:1.5")) for i in range(6)]
        proc = dispatchers("slowq", "--workers", "4")
        wait_for(lambda: target.count() >= 4, 20, "four requests in flight")
        # When it is told to stop mid-request
        proc.signal(signal.SIGTERM)
        assert proc.popen.wait(20) == 0
        # Then what it held was sent and acked before it exited, nothing left leased
        assert {r["state"] for r in lookup(c, ids)} == {"succeeded"}
        assert target.keys() == {f"g{i}" for i in range(6)}


def test_a_second_sigterm_exits_at_once_even_with_the_master_not_answering(cluster, target,
                                                                           dispatchers):
    with Client(cluster.master_addr) as c:
        # Given two requests in flight, and a master that has stopped answering
        ids = [c.enqueue_task("stuck", url=target.url(f"h{i}", "slow:30"), timeout_s=60)
               for i in range(2)]
        proc = dispatchers("stuck", "--workers", "2", "--lease-s", "60")
        wait_for(lambda: target.count() == 2, 20, "two requests in flight")
        cluster.master.signal(signal.SIGSTOP)
        try:
            # When a first SIGTERM has begun a gentle stop, and a second one follows
            proc.signal(signal.SIGTERM)
            wait_for(lambda: "stopping: " in proc.tail(), 10, "the first signal taken")
            signalled = time.monotonic()
            proc.signal(signal.SIGTERM)
            # Then the dispatcher exits at once, without waiting for the master
            assert proc.popen.wait(10) == 0, proc.tail()
            assert time.monotonic() - signalled < 2.0
        finally:
            cluster.master.signal(signal.SIGCONT)
        assert "dispatched: leased 2, succeeded 0" in proc.tail()
        # And the tasks stay leased until their leases run out, then come back
        assert {r["state"] for r in lookup(c, ids)} == {"in_flight"}


def test_tasks_go_only_to_allowed_hosts(cluster, target, dispatchers):
    with Client(cluster.master_addr) as c:
        # Given a dispatcher allowed 127.0.0.1 and *.example.com only
        proc = dispatchers("guarded", "--allow-hosts", "127.0.0.1, *.example.com")
        allowed = c.enqueue_task("guarded", url=target.url("allowed"))
        # When a task names another host (here the same endpoint by another name)
        refused = c.enqueue_task("guarded", url=f"http://localhost:{target.port}/refused",
                                 max_attempts=5)
        rows = settled(c, [allowed, refused])
    # Then it is dead-lettered at once with the reason, and nothing was sent to it
    assert rows[allowed]["state"] == "succeeded"
    assert (rows[refused]["state"], rows[refused]["attempts"]) == ("failed", 1)
    assert rows[refused]["error"] == ("attempt 1/5: host 'localhost' is not in the "
                                      "dispatcher's --allow-hosts; not sent")
    assert target.keys() == {"allowed"}
    proc.signal(signal.SIGTERM)
    assert proc.popen.wait(15) == 0
    assert "dispatched: leased 2, succeeded 1, retried 0, dead 1" in proc.tail()


def test_task_shows_queued_scheduled_in_flight_failed_and_unknown(cluster):
    m = cluster.master_addr
    with Client(m) as c:
        queued = c.enqueue_task("t", url="http://127.0.0.1:9/a", max_attempts=2)
        scheduled = c.enqueue_task("t", url="http://127.0.0.1:9/b", delay_s=600)
        leased = c.enqueue_task("t", url="http://127.0.0.1:9/c")
        dying = c.enqueue_task("t", url="http://127.0.0.1:9/d")
        held = {msg.id: msg for msg in c.dequeue_many("t", 3)}
        assert set(held) == {queued, leased, dying}
        held[queued].nack(delay_s=0, error="attempt 1/2: HTTP 503")  # back in line
        bury(c, [held[dying]], "attempt 5/5: HTTP 410 Gone")
        with pytest.raises(LeaseExpired):  # a bury names only held leases
            bury(c, [held[dying]], "again")
        with pytest.raises(InvalidArgument):
            lookup(c, [])
        with pytest.raises(InvalidArgument, match="at least one"):  # the master checks too
            c.master.call(p.Lookup([]))
        with pytest.raises(InvalidArgument, match="differ in length"):
            c.master.call(p.Bury([queued, leased], [1], "x"))
    doc = json.loads(run("task", str(queued), str(scheduled), str(leased), str(dying), "999999",
                         "--json", master=m).stdout)
    rows = {r["id"]: r for r in doc["tasks"]}
    assert [rows[i]["state"] for i in (queued, scheduled, leased, dying, 999999)] == \
        ["queued", "scheduled", "in_flight", "failed", "unknown"]
    assert (rows[queued]["attempts"], rows[queued]["error"]) == (1, "attempt 1/2: HTTP 503")
    assert rows[scheduled]["until"] > time.time() + 500
    assert rows[leased]["until"] > time.time() and rows[leased]["queue"] == "t"
    assert (rows[dying]["queue"], rows[dying]["error"]) == ("t.dead", "attempt 5/5: HTTP 410 Gone")
    text = run("task", str(scheduled), str(leased), master=m).stdout.decode()
    assert "scheduled" in text and "due: " in text and "lease ends: " in text
    counts = run("queue", "stats", "t", "--tasks", master=m).stdout.decode()
    assert "queued: 1\nscheduled: 1\nin flight: 1\nsucceeded: 0\nfailed: 1" in counts


def test_bad_command_lines_are_usage_errors(cluster):
    m = cluster.master_addr
    for args in (["dispatch", "--queues", "bad name!"], ["dispatch", "--queues", ","],
                 ["dispatch", "--queues", "q", "--workers", "0"], ["task", "abc"], ["task"],
                 ["dispatch", "--queues", "q", "--allow-hosts", "http://a.example.com/"],
                 ["dispatch", "--queues", "q", "--allow-hosts", "*"],
                 ["dispatch", "--queues", "q", "--allow-hosts", ","]):
        proc = run(*args, master=m, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count(b"\n") <= 4 and b"Traceback" not in proc.stderr


def test_a_refused_key_stops_the_dispatcher_with_an_error(cluster, tmp_path):
    env = dict(os.environ, BLIZZARD_KEYS=str(tmp_path / "no-such-keys"))
    proc = subprocess.run([*BLIZZARD, "dispatch", "--master", cluster.master_addr,
                           "--queues", "q"], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr, proc.stderr[-2000:]



def test_a_lookup_answers_each_id_once_and_its_errors_stay_bounded():
    from master.jobs import http_delivery as tasks

    from support.in_process_master import alloc, call, in_process_master

    master = in_process_master(replication=1)
    placement = alloc(master, 1)
    call(master, p.Commit(placement.ids, ["dn-a"], "c1"))
    (item,) = placement.ids
    leased = call(master, p.Lease("q", 1, 30.0, 0.0, "l1", [], []))
    call(master, p.Nack(leased.ids, leased.leases, 60.0, "\N{SNOWMAN}" * tasks.MAX_ERROR))
    (one,) = call(master, p.Lookup([item])).errors
    assert one == "\N{SNOWMAN}" * tasks.MAX_ERROR  # one id: the whole error
    reply = call(master, p.Lookup([item] * 9_999 + [item + 1]))
    assert reply.ids == [item, item + 1] and reply.states == ["scheduled", "unknown"]
    many = call(master, p.Lookup([item] + list(range(item + 1, item + 10_000))))
    assert tasks.MIN_ERROR_SHOWN <= len(many.errors[0]) < 200  # cut, so 10,000 fit the budget
    assert len(p.encode(1, many)) < tasks.LOOKUP_ERROR_BYTES


def test_burying_an_item_already_dead_gives_it_back_after_a_back_off_not_at_once():
    from master.jobs import http_delivery as tasks

    from support.in_process_master import alloc, call, in_process_master

    master = in_process_master(replication=1)
    placement = alloc(master, 1)
    call(master, p.Commit(placement.ids, ["dn-a"], "c1"))
    leased = call(master, p.Lease("q", 1, 30.0, 0.0, "l1", [], []))
    assert call(master, p.Bury(leased.ids, leased.leases, "gave up")).done == 1
    from_dead = call(master, p.Lease("q.dead", 1, 30.0, 0.0, "l2", [], []))
    assert from_dead.ids == leased.ids
    before = time.time()
    assert call(master, p.Bury(from_dead.ids, from_dead.leases, "again")).done == 1
    assert call(master, p.Lease("q.dead", 1, 30.0, 0.0, "l3", [], [])).ids == []
    assert call(master, p.Lookup(leased.ids)).states == ["failed"]  # still a dead task
    assert master.state.delays[leased.ids[0]] >= before + tasks.MIN_REBURY_S
