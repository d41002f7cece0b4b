"""The blizzard command, run as a real process against a real cluster."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from blizzard import Client
from blizzard.local.harness import free_port

from support.wait import wait_for

pytestmark = pytest.mark.cluster  # the real command, in processes of its own

BLIZZARD = [sys.executable, "-m", "blizzard.cli"]


def run(*args: str, master: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if master:
        env["BLIZZARD_MASTER"] = master
    proc = subprocess.run([*BLIZZARD, *args], capture_output=True, text=True, env=env, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


def test_enqueue_dequeue_status_through_the_cli(cluster):
    out = run("enqueue", "jobs", "one", "two", "three", master=cluster.master_addr).stdout.split()
    assert len(out) == 3 and all(x.isdigit() for x in out)
    got = run("dequeue", "jobs", "--n", "2", "--ack", master=cluster.master_addr).stdout
    assert got == f"id={out[0]}\tdata=one\nid={out[1]}\tdata=two\n"
    status = run("status", "--master", cluster.master_addr).stdout
    assert "alive" in status and "jobs" in status
    assert run("dequeue", "jobs", "--no-ack", master=cluster.master_addr).stdout.endswith("three\n")
    empty = run("dequeue", "jobs", master=cluster.master_addr, check=False)
    assert empty.returncode == 3 and "empty" in empty.stderr


def test_cli_errors_are_one_clear_line(cluster):
    bad = run("enqueue", "jobs", "x", "--master", "localhost:1", check=False)
    assert bad.returncode == 2 and "not an address" in bad.stderr
    bad = run("dequeue", "jobs", "--lease-s", "-5", master=cluster.master_addr, check=False)
    assert bad.returncode == 2 and "lease-s" in bad.stderr
    down = run("status", "--master", f"tcp://127.0.0.1:{free_port()}", "--timeout-s", "0.5",
               check=False)
    assert down.returncode == 1 and "MasterUnavailable" in down.stderr
    assert "given by --master" in down.stderr and "blizzard cluster" in down.stderr


def test_no_master_says_where_the_address_came_from_within_the_timeout():
    addr = f"tcp://127.0.0.1:{free_port()}"
    from_env = run("queue", "list", "--timeout-s", "0.5", master=addr, check=False)
    assert from_env.returncode == 1 and "taken from BLIZZARD_MASTER" in from_env.stderr
    env = {k: v for k, v in os.environ.items() if k != "BLIZZARD_MASTER"}
    default = subprocess.run([*BLIZZARD, "status", "--timeout-s", "0.5"], capture_output=True,
                             text=True, env=env, timeout=60)
    assert default.returncode == 1 and "the default" in default.stderr
    assert "Is a master running?" in default.stderr


def test_wal_check_json(cluster):
    run("enqueue", "jobs", "a", "b", master=cluster.master_addr)
    cluster.master.kill()
    out = run("wal", "check", os.path.join(cluster.base_dir, "master"), "--json").stdout
    doc = json.loads(out)
    assert set(doc) == {"verdict", "checkpoint", "segments", "problems", "items", "id_hi",
                        "queues"}
    assert doc["verdict"] == "ok" and doc["items"] == 2
    assert doc["queues"]["jobs"] == {"ready": 2, "delayed": 0, "leased": 0}
    assert doc["segments"] and set(doc["segments"][0]) == {"name", "records", "bytes"}


@pytest.mark.parametrize("module", ["master", "datanode", "blizzard.cli.main"])
def test_help_explains_every_entry_point(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and "--help" in out.stdout and "Usage" in out.stdout


def pid_of(data_dir: pathlib.Path) -> int:
    """The process started with ``--data-dir data_dir`` (from /proc)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if str(data_dir).encode() in argv:
                return int(entry)
    raise AssertionError(f"no process runs with --data-dir {data_dir}")


def test_cluster_command_runs_everything_survives_a_dead_node_and_stops_on_ctrl_c(tmp_path):
    port = free_port()
    proc = subprocess.Popen([*BLIZZARD, "cluster", "--data-dir", str(tmp_path), "--datanodes", "3",
                             "--port", str(port), "--node-port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        addr = f"tcp://127.0.0.1:{port}"
        keys = tmp_path / "keys"  # made by the command: secure without extra steps
        wait_for(lambda: (keys / "client.key_secret").exists(), what="the cluster's keys")
        with Client(addr, timeout_s=10, keys=str(keys)) as c:
            def alive():
                try:
                    return sum(n.alive for n in c.status().nodes)
                except Exception:
                    return 0
            wait_for(lambda: alive() == 3, timeout_s=30, what="the cluster to come up")
            c.enqueue("q", b"x")
            # a data node killed: the cluster goes on with the others, as a real one would
            os.kill(pid_of(tmp_path / "datanode1"), signal.SIGKILL)
            wait_for(lambda: alive() == 2, timeout_s=30, what="the killed node seen dead")
            c.enqueue("q", b"y")
            assert sorted(m.data for m in c.dequeue_many("q", 2)) == [b"x", b"y"]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "datanode1 (" in out and "exited; the cluster goes on" in out
        assert "stopped" in out and f"export BLIZZARD_KEYS={keys}" in out
    finally:
        if proc.poll() is None:
            proc.kill()
