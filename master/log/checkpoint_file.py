"""Checkpoints: the master's whole state plus the WAL segment replay starts from.

File ``checkpoint-<segment>.ckpt``: ``MAGIC <u64 wal_start> <u64 length> <u32 crc32> body``,
body = the msgpack objects of ``State.export_parts()``, one after another. Written to a temp file,
fsynced, renamed, and the directory fsynced, so a crash leaves either the old checkpoint or the new
one, never half. Only after the new one is durable are older checkpoints and the segments it covers
removed.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from blizzard.wire import protocol
from master.log.wal import WalCorrupt, fsync_dir, list_segments, segment_name

log = logging.getLogger(__name__)

MAGIC = b"BLZCKPT1"
HEADER = struct.Struct("<QQI")
_NAME = re.compile(r"^checkpoint-(\d{12})\.ckpt$")


def checkpoint_name(wal_start: int) -> str:
    return f"checkpoint-{wal_start:012d}.ckpt"


def list_checkpoints(directory: str) -> list[int]:
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(directory) if (m := _NAME.match(name)))


def write(directory: str, wal_start: int, parts: Iterable[Any]) -> str:
    """Write a checkpoint durably; return its path. Raises OSError on any failure."""
    body = b"".join(map(protocol.dumps, parts))
    path = os.path.join(directory, checkpoint_name(wal_start))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(MAGIC + HEADER.pack(wal_start, len(body), zlib.crc32(body)))
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fsync_dir(directory)
    return path


def read(path: str) -> tuple[int, Iterator[Any]]:
    """(wal_start, the exported parts) of a checkpoint; raises WalCorrupt if it is damaged."""
    with open(path, "rb") as f:
        data = f.read()
    head = len(MAGIC) + HEADER.size
    if len(data) < head or not data.startswith(MAGIC):
        raise WalCorrupt(f"{path}: not a checkpoint (bad magic or too short)")
    wal_start, length, crc = HEADER.unpack_from(data, len(MAGIC))
    body = data[head:]
    if len(body) != length or zlib.crc32(body) != crc:
        raise WalCorrupt(f"{path}: checksum mismatch ({len(body)} of {length} bytes)")
    return wal_start, protocol.iter_loads(body)


def load_latest(directory: str) -> tuple[int, Iterator[Any]] | None:
    """The newest checkpoint, or None if there is none; refuses a damaged newest checkpoint.

    Older checkpoints are not a fallback: the segments between them and the newest are gone.
    """
    found = list_checkpoints(directory)
    if not found:
        return None
    return read(os.path.join(directory, checkpoint_name(found[-1])))


def prune(directory: str, wal_start: int, keep_from: int | None = None) -> int:
    """Remove checkpoints older than ``wal_start`` and the segments before it, except those from
    ``keep_from`` on (a standby still reads them); return how many."""
    removed = 0
    for index in list_checkpoints(directory):
        if index < wal_start:
            os.remove(os.path.join(directory, checkpoint_name(index)))
            removed += 1
    for index in list_segments(directory):
        if index < min(wal_start, wal_start if keep_from is None else keep_from):
            os.remove(os.path.join(directory, segment_name(index)))
            removed += 1
    for name in os.listdir(directory):
        if name.endswith(".ckpt.tmp"):
            os.remove(os.path.join(directory, name))
    fsync_dir(directory)
    return removed
