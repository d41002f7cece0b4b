"""Secrets and data stay with the servers' user: key files are checked, data files are private.

Real processes: a server started from a key directory other users may read is refused with
one line saying the fix; data directories are 0700 and every file in them 0600, whatever
umask the server was started with; ``keys export-client`` makes what a client machine needs.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from blizzard import Client
from blizzard.local.harness import free_port
from blizzard.net import keys as k


def mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_data_directories_and_files_are_the_servers_alone(cluster_factory):
    old = os.umask(0o022)  # what a shell often has: the servers start with it
    try:
        cl = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5,
                             master_args=["--checkpoint-records", "50"])
        with Client(cl.master_addr, timeout_s=10) as c:
            for i in range(20):
                c.enqueue_many("private", [b"payload %d" % i] * 5)
        status = cl.status()  # a round trip after the writes
        assert status.nodes
    finally:
        os.umask(old)
    checked = 0
    for name in ["master", "datanode0", "datanode1"]:
        top = os.path.join(cl.base_dir, name)
        assert mode(top) == 0o700, name
        for root, dirs, files in os.walk(top):
            for d in dirs:
                assert mode(os.path.join(root, d)) & 0o077 == 0, os.path.join(root, d)
            for f in files:
                path = os.path.join(root, f)
                assert mode(path) & 0o077 == 0, f"{path} is {mode(path):o}"
                checked += 1
    assert checked >= 10  # WAL segments, LevelDB files, node ids, capability keys


def start_master(keys: str, data_dir: str) -> subprocess.CompletedProcess:
    """A master started on ``keys`` that is expected to refuse to start."""
    return subprocess.run([sys.executable, "-m", "master", "--data-dir", data_dir, "--bind",
                           f"tcp://127.0.0.1:{free_port()}", "--keys", keys],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.cluster
def test_a_key_directory_other_users_may_read_or_change_is_refused(tmp_path):
    keys = str(tmp_path / "keys")
    k.generate(keys)
    secret = os.path.join(keys, "client.key_secret")
    os.chmod(secret, 0o644)  # any local user could act as a client
    out = start_master(keys, str(tmp_path / "m1"))
    assert out.returncode == 1
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("Error:")]
    assert "readable by other users" in line and f"chmod 600 {secret}" in line
    os.chmod(secret, 0o600)
    os.chmod(keys, 0o777)  # any local user could add a key of their own
    out = start_master(keys, str(tmp_path / "m2"))
    assert out.returncode == 1 and f"chmod 700 {keys}" in out.stderr
    assert not os.path.exists(tmp_path / "m2" / "wal")  # refused before touching anything


def test_a_listable_key_directory_is_warned_about(tmp_path, caplog):
    keys = str(tmp_path / "keys")
    k.generate(keys)
    os.chmod(keys, 0o755)
    with caplog.at_level("WARNING", logger="blizzard.net.keys"):
        k.ServerKeys.from_dir(keys, "master")
    assert any("may be listed by other users" in r.getMessage() for r in caplog.records)


def test_export_client_makes_what_a_client_machine_needs_and_nothing_more(cluster, tmp_path):
    out = str(tmp_path / "laptop")
    proc = subprocess.run([sys.executable, "-m", "blizzard.cli", "keys", "export-client",
                           cluster.keys, out], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["client.key", "client.key_secret", "datanode.key",
                                       "master.key"]
    assert mode(out) == 0o700 and all(mode(os.path.join(out, f)) == 0o600 for f in os.listdir(out))
    for server in ["master", "datanode"]:  # public halves only: no server secret leaves
        assert "secret-key" not in open(os.path.join(out, server + ".key")).read()
    with Client(cluster.master_addr, timeout_s=10, keys=out) as c:  # it works as it is
        c.enqueue("exported", b"hello")
        assert c.dequeue("exported", wait_s=5).data == b"hello"
    again = subprocess.run([sys.executable, "-m", "blizzard.cli", "keys", "export-client",
                            cluster.keys, out], capture_output=True, text=True, timeout=30)
    assert again.returncode == 1 and "not an empty directory" in again.stderr
    shutil.rmtree(out)
