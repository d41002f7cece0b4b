"""A server's ready file (blizzard/server/ready_file.py): how whoever started a master knows it
serves, and which cluster it is, without reading its log."""

from __future__ import annotations

import os

from blizzard.server import ready_file


def test_a_ready_file_is_read_back_whole_and_is_gone_once_removed(tmp_path):
    data_dir = str(tmp_path)
    assert ready_file.read(data_dir) is None
    ready_file.write(data_dir, pid=12, addr="tcp://127.0.0.1:5555", cluster_id="ab" * 8)
    assert ready_file.read(data_dir) == {"pid": 12, "addr": "tcp://127.0.0.1:5555",
                                         "cluster_id": "ab" * 8}
    assert os.listdir(data_dir) == ["ready"]  # written beside and renamed: no temporary left
    assert os.stat(ready_file.path(data_dir)).st_mode & 0o777 == 0o600
    ready_file.write(data_dir, pid=13)  # a new run's replaces the old one's
    assert ready_file.read(data_dir) == {"pid": 13}
    ready_file.remove(data_dir)
    ready_file.remove(data_dir)  # removing what is not there is no error
    assert ready_file.read(data_dir) is None


def test_a_master_says_it_serves_in_its_ready_file_and_takes_it_back_as_it_stops(
        cluster_factory):
    cl = cluster_factory(datanodes=1, replication=1)
    master_dir = os.path.join(cl.base_dir, "master")
    ready = ready_file.read(master_dir)
    assert ready is not None and cl.master is not None and cl.master.popen is not None
    assert ready == {"pid": cl.master.popen.pid, "addr": cl.master_addr,
                     "cluster_id": cl.status().cluster_id}
    cl.master.stop()
    assert cl.master.popen.returncode == 0
    assert ready_file.read(master_dir) is None
