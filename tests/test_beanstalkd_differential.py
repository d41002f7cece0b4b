"""``blizzard beanstalkd`` side by side with the real beanstalkd (Debian's 1.12, which
``scripts/test`` installs): the same sessions sent to both, replies compared field by field
(``tests/support/beanstalk_diff.py``). Where the gateway must differ, ``DIFFERENCES`` names the
difference and its reason, as docs/beanstalkd.md does; any other difference fails, and so does
a listed one that is no longer found."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess

import pytest

from blizzard.local.harness import free_port

from support.beanstalk_diff import Step, differences
from support.gateway import beanstalkd_on_new_cluster, listening
from support.wait import wait_for

pytestmark = pytest.mark.cluster

MAX_JOB = 1024  # both servers': beanstalkd -z, the gateway's max_job_bytes

S = Step
SESSIONS: dict[str, list[Step]] = {
    "put-reserve-delete": [
        S("use", "use a1\r\n"), S("watch", "watch a1\r\n"), S("ignore", "ignore default\r\n"),
        S("put", "put 5 0 10 3\r\nabc\r\n"),
        S("put binary", b"put 0 0 10 6\r\n\r\n\x00\xff\r\n\r\n"),
        S("reserve", "reserve-with-timeout 1\r\n"), S("stats-job reserved", "stats-job {1}\r\n"),
        S("touch", "touch {1}\r\n"), S("delete", "delete {1}\r\n"),
        S("delete again", "delete {1}\r\n"), S("reserve binary", "reserve\r\n"),
        S("delete binary", "delete {2}\r\n"), S("reserve none", "reserve-with-timeout 0\r\n"),
    ],
    "tubes": [
        S("list-tube-used", "list-tube-used\r\n"), S("use", "use b1\r\n"),
        S("watch", "watch b2\r\n"), S("watch again", "watch b2\r\n"),
        S("list-tubes-watched", "list-tubes-watched\r\n"),
        S("list-tubes after use and watch", "list-tubes\r\n"),
        S("ignore", "ignore b2\r\n"), S("ignore not watched", "ignore b9\r\n"),
        S("ignore the last", "ignore default\r\n"),
        S("bad name", "use -bad\r\n"), S("long name", "use " + "t" * 201 + "\r\n"),
        S("longest name", "use " + "t" * 200 + "\r\n"),
    ],
    "release-bury-kick": [
        S("use", "use c1\r\n"), S("watch", "watch c1\r\n"), S("ignore", "ignore default\r\n"),
        S("put", "put 100 0 30 1\r\nx\r\n"), S("stats-tube urgent", "stats-tube c1\r\n"),
        S("reserve", "reserve-with-timeout 1\r\n"),
        S("release", "release {1} 200 0\r\n"), S("stats-job released", "stats-job {1}\r\n"),
        S("reserve again", "reserve-with-timeout 1\r\n"), S("bury", "bury {1} 300\r\n"),
        S("stats-job buried", "stats-job {1}\r\n"), S("peek-buried", "peek-buried\r\n"),
        S("stats-tube buried", "stats-tube c1\r\n"), S("kick buried", "kick 5\r\n"),
        S("stats-job kicked", "stats-job {1}\r\n"), S("kick nothing", "kick 5\r\n"),
        S("put delayed", "put 1 100 30 1\r\nd\r\n"), S("peek-delayed", "peek-delayed\r\n"),
        S("kick delayed", "kick 5\r\n"), S("reserve kicked", "reserve-with-timeout 1\r\n"),
        S("delete kicked", "delete {2}\r\n"), S("reserve first", "reserve-with-timeout 1\r\n"),
        S("delete first", "delete {1}\r\n"), S("put delayed again", "put 1 100 30 1\r\ne\r\n"),
        S("kick-job delayed", "kick-job {3}\r\n"), S("kick-job again", "kick-job {3}\r\n"),
        S("peek kicked", "peek {3}\r\n"), S("reserve it", "reserve-with-timeout 1\r\n"),
        S("delete it", "delete {3}\r\n"),
    ],
    "errors": [
        S("unknown command", "bogus\r\n"), S("put short", "put 1 0 10\r\n"),
        S("put words", "put a b c d\r\n"), S("body too long", "put 1 0 10 2\r\nabcd\r\n"),
        S("job too big", f"put 1 0 10 {MAX_JOB + 1}\r\n" + "x" * (MAX_JOB + 1) + "\r\n"),
        S("largest job", f"put 1 0 10 {MAX_JOB}\r\n" + "y" * MAX_JOB + "\r\n"),
        S("delete unknown", "delete 99999\r\n"), S("release unknown", "release 99999 1 0\r\n"),
        S("bury unknown", "bury 99999 1\r\n"), S("touch unknown", "touch 99999\r\n"),
        S("peek unknown", "peek 99999\r\n"), S("peek zero", "peek 0\r\n"),
        S("kick-job unknown", "kick-job 99999\r\n"), S("stats-job unknown", "stats-job 99999\r\n"),
        S("stats-tube unknown", "stats-tube nope\r\n"),
        S("reserve-job unknown", "reserve-job 99999\r\n"),
        S("release not reserved", "release {1} 1 0\r\n"), S("bury not reserved", "bury {1} 1\r\n"),
        S("touch not reserved", "touch {1}\r\n"), S("delete it", "delete {1}\r\n"),
        S("peek-ready empty", "peek-ready\r\n"), S("peek-delayed empty", "peek-delayed\r\n"),
        S("peek-buried empty", "peek-buried\r\n"),
    ],
    "pipelined": [
        S("use, put, put, peek-ready at once",
          "use e1\r\nput 3 0 10 1\r\na\r\nput 2 0 10 1\r\nb\r\npeek-ready\r\n", 4),
        S("watch, ignore, reserve, delete at once",
          "watch e1\r\nignore default\r\nreserve\r\n", 3),
        S("delete both", "delete {1}\r\ndelete {2}\r\n", 2),
    ],
    # a connection closed in the middle of a put's body, and one holding a reserved job
    "closed mid-command": [
        S("use", "use g1\r\n"), S("half a body, then the close", "put 1 0 10 10\r\nabc", 0),
    ],
    "closed holding a job": [
        S("use", "use g2\r\n"), S("watch", "watch g2\r\n"), S("put", "put 1 0 60 1\r\nk\r\n"),
        S("reserve, then the close", "reserve-with-timeout 1\r\n"),
    ],
    "after the closes": [
        S("use g1", "use g1\r\n"), S("nothing was put", "peek-ready\r\n"),
        S("use g2", "use g2\r\n"), S("the job is ready again", "peek-ready\r\n"),
        S("stats-job", "stats-job {1}\r\n"), S("delete it", "delete {1}\r\n"),
    ],
    "stats": [
        S("stats", "stats\r\n"),
    ],
}

# The differences the gateway keeps, each with its reason (docs/beanstalkd.md lists them too).
DIFFERENCES: dict[tuple[str, str, str], str] = {
    ("release-bury-kick", "stats-tube urgent", "current-jobs-urgent"):
        "the cluster counts a queue's ready items, not those of a priority below 1024: "
        "current-jobs-urgent is 0",
}


@pytest.fixture
def beanstalkd_server():
    """The real beanstalkd on a free port: (its port, its process)."""
    path = shutil.which("beanstalkd")
    assert path, "the real beanstalkd is needed: scripts/test installs it (apt-get beanstalkd)"
    port = free_port()
    proc = subprocess.Popen([path, "-l", "127.0.0.1", "-p", str(port), "-z", str(MAX_JOB)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(lambda: listening(port), what="beanstalkd to listen")
    yield port, proc
    proc.kill()
    proc.wait(10)


@pytest.fixture
def real_beanstalkd(beanstalkd_server):
    return beanstalkd_server[0]


@pytest.fixture
def gateway(cluster_factory, monkeypatch):
    for gw in beanstalkd_on_new_cluster(cluster_factory, monkeypatch, max_job_bytes=MAX_JOB):
        assert listening(gw.port)  # one connection before the sessions, as beanstalkd's probe
        yield gw


def test_the_gateway_answers_as_beanstalkd_but_for_the_named_differences(real_beanstalkd,
                                                                          gateway):
    found: set[tuple[str, str, str]] = set()
    transcript: list[str] = []
    for name, steps in SESSIONS.items():  # in order: the last session's stats count them all
        more, lines = differences(name, steps, real_beanstalkd, gateway.port, lambda: wait_for(
            lambda: not gateway.sessions, what="the gateway to see the connection close"))
        found |= more
        transcript += lines
    unexpected = sorted(found - DIFFERENCES.keys())
    gone = sorted(DIFFERENCES.keys() - found)
    assert not unexpected, "differences not on the list:\n" + "\n".join(
        line for line in transcript if tuple(line.split(" / ")[:2]) in
        {(s, label) for s, label, _ in unexpected})
    assert not gone, f"listed differences no longer found (take them off the list): {gone}"


DRAIN_BEFORE = [S("use", "use f1\r\n"), S("put", "put 1 0 10 1\r\na\r\n")]
DRAIN_AFTER = [
    S("use", "use f1\r\n"), S("put drained", "put 1 0 10 1\r\nb\r\n"),
    S("put too big drained", f"put 1 0 10 {MAX_JOB + 1}\r\n" + "x" * (MAX_JOB + 1) + "\r\n"),
    S("watch", "watch f1\r\n"), S("reserve the one put before", "reserve-with-timeout 1\r\n"),
    S("delete it", "delete {1}\r\n"), S("stats", "stats\r\n"),
    # last: what is left of a body that is too long starts the next line, on both servers
    S("put bad body drained", "put 1 0 10 1\r\nbb\r\n"), S("then", "list-tube-used\r\n"),
]


def _stats(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"stats\r\n")
        seen = b""
        while b"draining:" not in seen:
            more = sock.recv(65536)
            assert more, "the server closed the connection"
            seen += more
        return seen


def test_drain_mode_refuses_puts_and_serves_the_rest_as_beanstalkd(beanstalkd_server, gateway):
    """beanstalkd enters drain mode on SIGUSR1; the gateway's process does too (its CLI's
    test), here ``drain()`` in its thread."""
    port, proc = beanstalkd_server
    closed = lambda: wait_for(lambda: not gateway.sessions,  # noqa: E731 (a short callback)
                              what="the gateway to see the connection close")
    found, transcript = differences("before drain", DRAIN_BEFORE, port, gateway.port, closed)
    proc.send_signal(signal.SIGUSR1)
    gateway.drain()
    polls = 0

    def drained() -> bool:
        nonlocal polls
        polls += 1
        return b"draining: true" in _stats(port)

    wait_for(drained, what="beanstalkd to enter drain mode")
    for _ in range(polls):  # as many connections and stats to each
        assert b"draining: true" in _stats(gateway.port)
    wait_for(lambda: not gateway.sessions, what="the gateway to see the connections close")
    more, lines = differences("drain", DRAIN_AFTER, port, gateway.port, closed)
    assert not found | more, "\n".join(transcript + lines)
