"""The dispatcher's loops in-process, on a fake master (``fake_master.py``) and real HTTP.

Backpressure, lease extension until an outcome is settled, batched settling, a loop that
dies, and a master that refuses a lease for a while: the loop logic, which needs no cluster.
The endpoints are real: a local aiohttp server (``http_target.py``), or a loopback port
nothing listens on (a refused connection, the fastest failure there is).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from blizzard.client.http_delivery import HttpTask
from blizzard.dispatch.deliver import DispatchConfig, Dispatcher
from blizzard.dispatch.settle import Delivery, Outcomes
from blizzard.local.harness import free_port
from blizzard.wire.errors import MasterUnavailable, RequestError, TooManyItems

from support.fake_master import FakeMaster
from support.http_target import HttpTarget


@pytest.fixture
def target():
    t = HttpTarget().start()
    yield t
    t.stop()


def dispatcher(fake: FakeMaster, **kw) -> Dispatcher:
    config = DispatchConfig("tcp://127.0.0.1:1", ("q",), **{"wait_s": 0.05, **kw})
    return Dispatcher(config, make_client=fake.client)


def run_until(d: Dispatcher, done: Callable[[], bool], timeout_s: float) -> bool:
    """Run the dispatcher until ``done()`` (then stop it gently) or it ends by itself;
    whether ``done()`` came true. Whatever ``run`` raises is raised."""
    async def drive() -> bool:
        running = asyncio.create_task(d.run())
        deadline = time.monotonic() + timeout_s
        while not running.done() and not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        reached = done()
        d.stop()
        await asyncio.wait_for(running, 30)
        return reached
    return asyncio.run(drive())


def test_a_batch_settles_each_outcome_as_it_was_decided():
    # Given four leased items: one succeeded, two failed with different back-offs, one dead
    fake = FakeMaster()
    for i in range(4):
        fake.add(i + 1, b"")
    one, two, three, four = (Delivery(m, None) for m in fake.lease(4, 30.0))
    outcomes = Outcomes()
    outcomes.acks.append(one)
    outcomes.nacks[(0.5, "HTTP 503")].append(two)
    outcomes.nacks[(2.0, "HTTP 502")].append(three)
    outcomes.burials["attempt 5/5: HTTP 500"].append(four)
    # When they are settled, then each call names its own items: one call per group
    assert outcomes.send(fake.client()) == 0
    assert fake.calls == [("ack", [one.key]), ("nack", [two.key]), ("nack", [three.key]),
                          ("bury", [four.key])]
    assert fake.nacks == [(0.5, "HTTP 503"), (2.0, "HTTP 502")]


def test_failures_faster_than_settling_stay_bounded_and_leased_until_settled():
    # Given 2,000 tasks to a port that refuses at once, 32 senders, 1 s leases, and a master
    # whose every settle call takes 20 ms (its fsync)
    fake = FakeMaster(settle_s=0.02)
    data = HttpTask.make(f"http://127.0.0.1:{free_port()}/refused", max_attempts=5,
                     backoff_s=0).encode()
    for i in range(2000):
        fake.add(i + 1, data)
    d = dispatcher(fake, workers=32, lease_s=1.0, batch=100)
    # When they are all sent and settled
    assert run_until(d, lambda: len(fake.settled("nack")) == 2000, 60)
    # Then the leases held never passed two rounds of work and two of outcomes to settle ...
    assert fake.most_held <= 4 * 32, fake.most_held
    # ... no outcome came after its lease ran out (held leases are extended until settled) ...
    assert fake.lost == []
    # ... and nacks went in batches, one call per back-off and error
    assert len(fake.nacks) < 2000 / 10, len(fake.nacks)
    (error,) = {error for _, error in fake.nacks}
    assert error.startswith("attempt 1/5: ClientConnectorError: Cannot connect to host"), error
    assert d.totals["retried"] == 2000


def test_a_second_lease_of_an_item_is_kept_apart_from_the_first(target):
    # Given an item whose first lease runs out while its request is slow
    fake = FakeMaster()
    data = HttpTask.make(target.url("twice", "slow:1,slow:3"), timeout_s=10).encode()
    fake.add(7, data)
    d = dispatcher(fake, workers=4, lease_s=1.0)
    expired = []

    def both_acked() -> bool:  # when it is leased again while the first request waits
        if len(target.times("twice")) == 1 and not expired:
            expired.append(fake.expire(7, data))
        return len(fake.settled("ack")) == 2
    assert run_until(d, both_acked, 20)
    # Then both were sent, and the second delivery's lease was kept until its own ack
    # (deciding the first, whose lease had run out, did not drop the second)
    assert len(target.times("twice")) == 2
    assert set(fake.settled("ack")) == {(7, 1), (7, 2)}
    assert ("ack", (7, 1)) in fake.lost and [k for _, k in fake.lost if k == (7, 2)] == []


def test_a_loop_that_raises_stops_the_dispatcher_and_says_why(target, caplog):
    # Given a dispatcher holding a slow task, whose lease extension hits a bug
    fake = FakeMaster()
    fake.add(1, HttpTask.make(target.url("slow", "slow:5"), timeout_s=10).encode())
    fake.extend_error = RuntimeError("a bug in extending")
    d = dispatcher(fake, workers=2, lease_s=1.0)
    # Then the dispatcher stops within seconds, raising it, with the traceback logged
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="a bug in extending"):
        run_until(d, lambda: False, 20)
    assert time.monotonic() - started < 5
    assert any(r.levelno == logging.CRITICAL and r.exc_info for r in caplog.records)


def test_a_lease_loop_that_raises_stops_the_dispatcher():
    fake = FakeMaster()
    fake.lease_errors = [ValueError("a bug in leasing")]
    with pytest.raises(ValueError, match="a bug in leasing"):
        run_until(dispatcher(fake), lambda: False, 20)


@pytest.mark.cluster
def test_blizzard_dispatch_with_a_failed_loop_exits_1_at_once():
    # Given a `blizzard dispatch` process whose settler has a bug (injected), and no master
    inject = ("import sys, blizzard.dispatch.settle as s\n"
              "async def broken(self): raise RuntimeError('injected bug')\n"
              "s.Settler.run = broken\n"
              "from blizzard.cli.main import main\n"
              "main()\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", inject, "dispatch", "--master",
                           f"tcp://127.0.0.1:{free_port()}", "--queues", "q"],
                          capture_output=True, timeout=60)
    # Then it logs the traceback and exits 1 with one line saying why, without waiting for
    # the master its lease loop is still calling
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.decode().splitlines()[-1] == (
        "error: the dispatcher stopped at once: RuntimeError: injected bug (the traceback is "
        "in the log)")
    assert b"the dispatcher's settler failed" in proc.stderr and b"Traceback" in proc.stderr
    assert time.monotonic() - started < 10


def test_a_master_refusing_leases_for_a_while_is_waited_out(target, caplog):
    # Given a master that refuses the first leases (too many long polls, unavailable)
    fake = FakeMaster()
    fake.lease_errors = [TooManyItems("too many long polls waiting (10000)"),
                         RequestError("refused for now"), MasterUnavailable("no answer"),
                         TooManyItems("too many long polls waiting (10000)")]
    for i in range(3):
        fake.add(i + 1, HttpTask.make(target.url(f"k{i}")).encode())
    d = dispatcher(fake)
    # Then the dispatcher backs off and tries again until its tasks are sent and acked
    caplog.set_level(logging.INFO, logger="blizzard.dispatch.deliver")
    assert run_until(d, lambda: len(fake.settled("ack")) == 3, 30)
    assert target.keys() == {"k0", "k1", "k2"}
    # And the refusals were logged once, and the recovery once
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "too many long polls" in warned[0].getMessage()
    assert sum("works again" in r.getMessage() for r in caplog.records) == 1
