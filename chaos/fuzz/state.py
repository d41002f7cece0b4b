"""What a cluster holds on disk, read after a clean stop, and how two such readings differ.

The fuzzer's promise is that hostile frames change nothing a user put in. ``Durable`` is that,
read from the files of stopped servers (what a restart would find), not from their answers:

- ``items``: every item the master's recovered state holds (checkpoint + WAL replay, as
  ``blizzard inspect`` reads it), each as its full record: id, queue, priority, order,
  size, checksum, key, replica set, enqueue time, attempts and status;
- ``queues``: every queue with its settings and its ready / delayed / leased counts;
- ``blobs``: each data node's blob ids with their checksums, read from its LevelDB.

``differences`` compares two readings. Items and blobs must be equal exactly. Every queue of
the first reading must be in the second with the same settings and counts; a queue only in
the second must be empty (a ``Configure`` of a client may create a queue of any name: that is
its right, and it holds no item). Not compared: the id high-water mark (a fuzzed ``Place``
reserves ids), the data nodes the master knows of (a fuzzed heartbeat with the node key
registers a node id of the fuzzer's), and the request ids it remembers.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from blizzard.local.harness import LocalCluster
from datanode.store import LevelDbStore
from master.log.inspect import recover


@dataclass(frozen=True)
class Durable:
    """One reading of a stopped cluster's files (see the module docstring)."""

    items: dict[int, tuple]
    queues: dict[str, tuple]
    blobs: dict[str, dict[int, int]]  # data node name -> blob id -> crc
    verdict: str  # the master's WAL: ok, torn or corrupt

    def summary(self) -> dict[str, Any]:
        return {"items": len(self.items), "queues": len(self.queues),
                "blobs": {name: len(b) for name, b in self.blobs.items()},
                "wal": self.verdict}


def read(cluster: LocalCluster) -> Durable:
    """Read the files of ``cluster``, whose processes must all be stopped."""
    assert cluster.master is not None and not cluster.master.alive
    report, state = recover(os.path.join(cluster.base_dir, "master"))
    items = {item_id: tuple(item) for item_id, item in state.items.items()}
    queues = {q.name: (tuple(sorted(asdict(q.config).items())), q.n_ready, q.n_delayed,
                       q.n_leased) for q in state.queues.values()}
    blobs = {}
    for i, node in enumerate(cluster.nodes):
        assert not node.alive
        store = LevelDbStore(os.path.join(cluster.base_dir, f"datanode{i}", "blobs"))
        try:
            ids = list(store.ids())
            found = store.get_many(ids)
            blobs[node.name] = {item_id: (f[1] if f is not None else -1)
                                for item_id, f in zip(ids, found, strict=True)}
        finally:
            store.close()
    return Durable(items, queues, blobs, report.verdict)


def read_stopped(cluster: LocalCluster, timeout_s: float = 30.0) -> Durable:
    """Stop ``cluster`` cleanly, read its files, start it again on the same addresses."""
    cluster.stop()
    durable = read(cluster)
    cluster.restart_master(timeout_s)
    for i in range(len(cluster.nodes)):
        cluster.restart_node(i)
    cluster.wait_ready(timeout_s, nodes=len(cluster.nodes))
    return durable


def differences(before: Durable, after: Durable, limit: int = 10) -> list[str]:
    """What ``after`` holds that ``before`` did not, or lacks; empty if nothing a user put in
    changed."""
    out: list[str] = []
    if after.verdict != "ok":
        out.append(f"the master's WAL reads as {after.verdict}")
    for item_id in sorted(before.items.keys() | after.items.keys()):
        if before.items.get(item_id) != after.items.get(item_id):
            out.append(f"item {item_id}: {before.items.get(item_id)} -> {after.items.get(item_id)}")
    for name, was in before.queues.items():
        if after.queues.get(name) != was:
            out.append(f"queue {name!r}: {was} -> {after.queues.get(name)}")
    for name, now in after.queues.items():
        if name not in before.queues and now[1:] != (0, 0, 0):
            out.append(f"new queue {name[:40]!r} holds items: {now[1:]}")
    for node in sorted(before.blobs.keys() | after.blobs.keys()):
        was, now = before.blobs.get(node, {}), after.blobs.get(node, {})
        for item_id in sorted(was.keys() | now.keys()):
            if was.get(item_id) != now.get(item_id):
                out.append(f"{node} blob {item_id}: crc {was.get(item_id)} -> {now.get(item_id)}")
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])
