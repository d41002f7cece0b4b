"""Checkpoint files: durable round trip, damage refused, pruning what they cover."""

from __future__ import annotations

import os

import pytest

from master.log import checkpoint_file
from master.log.wal import Wal, WalCorrupt, list_segments


def test_write_read_round_trip(tmp_path):
    parts = [[1, 2, {"a": "b"}], [1, "q"], [2, "r"]]
    path = checkpoint_file.write(str(tmp_path), 7, iter(parts))
    assert os.path.basename(path) == "checkpoint-000000000007.ckpt"
    start, read = checkpoint_file.read(path)
    assert (start, list(read)) == (7, parts)
    start, latest = checkpoint_file.load_latest(str(tmp_path))
    assert (start, list(latest)) == (7, parts)


def test_a_damaged_newest_checkpoint_is_refused(tmp_path):
    path = checkpoint_file.write(str(tmp_path), 3, list(range(100)))
    with open(path, "r+b") as f:
        f.seek(-5, os.SEEK_END)
        f.write(b"\xff")
    with pytest.raises(WalCorrupt, match="checksum"):
        checkpoint_file.load_latest(str(tmp_path))


def test_prune_removes_older_checkpoints_and_covered_segments(tmp_path):
    w = Wal(str(tmp_path))
    list(w.replay())
    for _ in range(3):
        w.append(b"rec")
        w.flush()
        w.roll()
    checkpoint_file.write(str(tmp_path), 1, [])
    checkpoint_file.write(str(tmp_path), 3, [])
    (tmp_path / "checkpoint-000000000009.ckpt.tmp").write_bytes(b"half")
    checkpoint_file.prune(str(tmp_path), 3)
    assert checkpoint_file.list_checkpoints(str(tmp_path)) == [3]
    assert list_segments(str(tmp_path)) == [3]
    assert not (tmp_path / "checkpoint-000000000009.ckpt.tmp").exists()
