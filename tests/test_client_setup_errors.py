"""Set-up mistakes the client and the CLI name at once (first met in issue 31): a primary and its
standby listed as two shards, a master that is not running, a key directory that is not one.
Each is told at once, in the words of the front end used."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from blizzard import Client
from blizzard.client import core as client_module
from blizzard.client.sharded.client import split_shards
from blizzard.local.harness import free_port
from blizzard.net import keys as k
from blizzard.wire.errors import InvalidArgument, MasterUnavailable, MissingKeys

from support.wait import wait_for

BLIZZARD = [sys.executable, "-m", "blizzard.cli"]
QUICK_S = 3.0  # "within about 2 s"
CLI_START_S = 3.0  # a CLI process's own start, on a busy machine


def run_cli(*args: str,
            env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """``blizzard ARGS`` with ``env`` over this environment (a None value unsets); with its
    wall time."""
    full = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    started = time.monotonic()
    proc = subprocess.run([*BLIZZARD, *args], capture_output=True, text=True, env=full,
                          timeout=90)
    return proc, time.monotonic() - started


def nowhere() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


# -- 3. a primary and its standby are one shard: "A,B" ---------------------------------------

def test_an_address_in_two_shards_is_refused():
    with pytest.raises(InvalidArgument, match="listed as shard 0 and as shard 1"):
        split_shards("tcp://127.0.0.1:7001 tcp://127.0.0.1:7001")
    with pytest.raises(InvalidArgument, match="listed as shard 0 and as shard 1"):
        split_shards(["tcp://127.0.0.1:7001,tcp://127.0.0.1:7002", "tcp://127.0.0.1:7002"])


def test_a_primary_and_its_own_standby_listed_as_shards_are_refused_at_once(cluster_factory):
    cl = cluster_factory(standby=True, datanodes=1, replication=1, heartbeat_s=0.2,
                         dead_after_s=1.5)
    primary, standby = cl.master_addr, cl.second.addr
    for listed in ([primary, standby], f"{primary} {standby}", [standby, primary]):
        started = time.monotonic()
        with pytest.raises(InvalidArgument) as refused:
            Client(listed, timeout_s=30)
        assert time.monotonic() - started < QUICK_S
        assert f"is the standby of {primary}" in refused.value.message
        assert f'"{primary},{standby}"' in refused.value.message  # what to write instead

    proc, took = run_cli("status", env={"BLIZZARD_MASTER": f"{primary} {standby}"})
    assert proc.returncode == 1 and took < QUICK_S + CLI_START_S, (took, proc.stderr)
    assert f'"{primary},{standby}"' in proc.stderr and "InvalidArgument" in proc.stderr

    with Client(f"{primary},{standby}", timeout_s=30) as c:  # the right form serves
        c.enqueue("jobs", b"x")
        assert c.status().nodes


# -- 4. no master: said within seconds, with where the address came from --------------------

def test_a_client_where_nothing_listens_says_so_within_seconds():
    addr = nowhere()
    for call in (lambda c: c.enqueue("jobs", b"x"), lambda c: c.dequeue("jobs", wait_s=10),
                 lambda c: c.status()):
        started = time.monotonic()
        with pytest.raises(MasterUnavailable) as down:
            with Client(addr, timeout_s=30) as c:
                call(c)
        assert time.monotonic() - started < QUICK_S
        message = down.value.message
        assert down.value.refused and down.value.addr == addr
        assert f"nothing listens at {addr}" in message and "given to Client()" in message
        assert "blizzard cluster --data-dir DIR" in message and 'Client("tcp://' in message
        assert "--master" not in message  # Python's words, not the command line's


@pytest.mark.cluster
def test_the_default_address_is_named_as_the_default(monkeypatch):
    monkeypatch.setattr(client_module, "DEFAULT_MASTER", nowhere())
    started = time.monotonic()
    with pytest.raises(MasterUnavailable, match="Client\\(\\)'s default"):
        with Client(timeout_s=30) as c:
            c.queues()
    assert time.monotonic() - started < QUICK_S


@pytest.mark.cluster
def test_the_cli_says_nothing_listens_within_seconds_and_where_the_address_came_from():
    addr = nowhere()
    proc, took = run_cli("enqueue", "jobs", "x", "--timeout-s", "30",
                         env={"BLIZZARD_MASTER": addr})
    assert proc.returncode == 1 and took < QUICK_S + CLI_START_S, (took, proc.stderr)
    err = proc.stderr
    assert f"nothing listens at {addr}" in err and "taken from BLIZZARD_MASTER" in err
    assert "blizzard cluster --data-dir DIR" in err and "--master or BLIZZARD_MASTER" in err
    assert "Client(" not in err and len(err.strip().splitlines()) == 1


def test_a_master_that_accepts_but_does_not_answer_keeps_the_whole_timeout():
    with socket.socket() as mute:  # the kernel completes connections; nothing ever speaks
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)
        addr = f"tcp://127.0.0.1:{mute.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(MasterUnavailable) as silent:
            with Client(addr, timeout_s=3, keys="") as c:
                c.status()
        assert time.monotonic() - started >= 3
        assert not silent.value.refused and "did not answer within 3s" in silent.value.message


def test_a_client_that_was_answered_rides_through_a_master_restart(cluster):
    with Client(cluster.master_addr, timeout_s=30) as c:
        c.enqueue("jobs", b"before")
        cluster.master.kill()
        done: list[object] = []
        during = threading.Thread(target=lambda: done.append(c.status()))
        during.start()
        try:
            wait_for(lambda: c.master.refused, what="the client to meet the refused connection")
            cluster.restart_master()
        finally:
            during.join(60)
        # waited out, not "nothing listens" (the data nodes may not have reported to the new
        # master yet: its status may list none)
        assert len(done) == 1 and done[0].cluster_id
        c.enqueue("jobs", b"after")
        assert sorted(m.data for m in c.dequeue_many("jobs", 10, wait_s=1)) == \
            [b"after", b"before"]


# -- 5. a key directory that is not one: which files, and where the keys are -----------------

@pytest.mark.cluster
def test_keys_pointing_at_a_clusters_data_dir_say_where_its_keys_are(tmp_path):
    data = tmp_path / "data"
    k.generate(str(data / "keys"))
    with pytest.raises(MissingKeys) as missing:
        Client(nowhere(), keys=str(data))
    message = missing.value.message
    assert str(data / "client.key_secret") in message and str(data / "master.key") in message
    assert f"keys={str(data / 'keys')!r}" in message
    assert "keys generate" not in message and "--keys" not in message

    proc, _ = run_cli("status", "--keys", str(data), "--master", nowhere())
    assert proc.returncode == 1 and f"--keys {data / 'keys'}" in proc.stderr, proc.stderr
    assert "keys=" not in proc.stderr and str(data / "client.key_secret") in proc.stderr


@pytest.mark.cluster
def test_keys_pointing_nowhere_say_so_and_do_not_advise_new_keys(tmp_path):
    gone = tmp_path / "no-such-dir"
    with pytest.raises(MissingKeys) as missing:
        Client(nowhere(), keys=str(gone))
    message = missing.value.message
    assert "does not exist" in message and str(gone / "client.key_secret") in message
    assert "keys=DIR" in message and "--keys" not in message
    assert "a running one admits none of them" in message  # generating is no fix for a client

    proc, _ = run_cli("status", "--master", nowhere(), env={"BLIZZARD_KEYS": str(gone)})
    assert proc.returncode == 1 and "does not exist" in proc.stderr, proc.stderr
    assert "--keys DIR" in proc.stderr and "keys=DIR" not in proc.stderr
