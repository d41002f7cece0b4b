"""A sharded cluster as a chaos run sees one (``chaos run --masters N``).

``ChaosShards`` wraps a ``ShardedCluster`` in the surface the nemesis, the monitor and the run
use of a ``LocalCluster``: data nodes numbered across the shards (shard 0's first, then shard
1's, ...), so the schedule's node faults land on any shard; a merged status; every shard
restarted or healed. A master fault picks a shard (``shard_for``, fixed by the fault's number,
so a seed repeats its run) and is recorded with that shard as its target.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
from typing import Any

from blizzard.client.sharded.admin import merge_status
from blizzard.local.harness import Proc
from blizzard.local.shard_cluster import ShardedCluster
from blizzard.wire import protocol as p


class ChaosShards:
    """A ``ShardedCluster`` with a ``LocalCluster``'s surface, for the chaos tool."""

    standby = False  # no standby masters with shards (the CLI refuses the combination)
    second = None

    def __init__(self, sharded: ShardedCluster) -> None:
        self.sharded = sharded

    @property
    def base_dir(self) -> str:
        return self.sharded.base_dir

    @property
    def masters(self) -> str:
        """What clients are given: every shard's master, space-separated."""
        return " ".join(self.sharded.addrs)

    @property
    def nodes(self) -> list[Proc]:
        return [node for shard in self.sharded.shards for node in shard.nodes]

    def _node(self, i: int) -> tuple[Any, int]:
        """Shard and local index of data node ``i`` (numbered across the shards)."""
        for shard in self.sharded.shards:
            if i < len(shard.nodes):
                return shard, i
            i -= len(shard.nodes)
        raise IndexError(f"no data node {i}")

    def processes(self) -> list[Proc]:
        return [proc for shard in self.sharded.shards
                for proc in (shard.master, *shard.nodes) if proc is not None]

    def start(self) -> ChaosShards:
        self.sharded.start()
        return self

    def stop(self) -> None:
        self.sharded.stop()

    def restart_node(self, i: int, *, wipe: bool = False) -> None:
        shard, j = self._node(i)
        shard.restart_node(j, wipe=wipe)

    def shard_for(self, fault_number: int) -> int:
        return random.Random(fault_number).randrange(len(self.sharded.shards))

    def master_of(self, k: int) -> Proc:
        master = self.sharded.shards[k].master
        assert master is not None
        return master

    def restart_master(self, k: int, timeout_s: float = 30.0) -> None:
        self.sharded.restart_master(k, timeout_s)

    def heal_masters(self, timeout_s: float) -> None:
        """Every shard's master resumed, or restarted on its WAL if dead."""
        for k, shard in enumerate(self.sharded.shards):
            master = self.master_of(k)
            master.signal(signal.SIGCONT)
            if not master.alive:
                shard.restart_master(timeout_s)

    def status(self, timeout_s: float = 2.0) -> p.ClusterStatus:
        """Every shard's status merged; raises if one does not answer."""
        return merge_status([shard.status(timeout_s) for shard in self.sharded.shards])

    def wait_ready(self, timeout_s: float = 30.0, nodes: int | None = None) -> None:
        for shard in self.sharded.shards:
            shard.wait_ready(timeout_s)

    def remove_data(self) -> None:
        """Drop every shard's data directories after a passing run; the logs stay."""
        for shard in self.sharded.shards:
            for name in os.listdir(shard.base_dir):
                path = os.path.join(shard.base_dir, name)
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
