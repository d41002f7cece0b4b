"""A local sharded cluster: ``masters`` shards, each a ``LocalCluster`` of its own.

Shard ``k`` is a master started with ``--shard k`` (its ids start at ``k << 56``), ``--shards``
(every shard's address, so one address finds them all) and ``--heads-bind`` (its queues'
heads, published), with its own data nodes under ``base_dir/shard<k>``. Nothing is shared
between shards, so a shard's master going down stalls only that shard's items.

Used by ``blizzard cluster --masters N``, the integration tests, ``scripts/bench-pei`` and
``chaos run --masters N``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from blizzard.local.harness import AUTO_KEYS, LocalCluster, StartFailed, free_port
from blizzard.net.defaults import LOOPBACK


@dataclass
class ShardedCluster:
    """``masters`` shards of ``datanodes`` data nodes each, under ``base_dir``."""

    base_dir: str
    masters: int = 3
    datanodes: int = 2  # per shard
    replication: int = 2
    heads: bool = True  # every master publishes its heads (``--heads-bind``)
    standby: bool = False  # each shard with a hot standby too
    master_port: int | None = None  # shard k's master on master_port + k; None: free ports
    node_base_port: int | None = None  # shard k's data node i on base + k * datanodes + i
    keys: str | None = AUTO_KEYS
    metrics: bool = False
    log_format: str = "text"
    heartbeat_s: float = 1.0
    dead_after_s: float = 5.0
    master_args: Sequence[str] = ()
    shards: list[LocalCluster] = field(default_factory=list)

    def _port(self, k: int) -> int:
        return self.master_port + k if self.master_port else free_port()

    def start(self, timeout_s: float = 60.0) -> ShardedCluster:
        """Start every shard and wait for all. The masters' ports are chosen first (each is
        told them all), so another process may take one before its shard starts: with ports
        chosen freely, such a start is tried again on new ones."""
        attempts = 1 if self.master_port else 3
        for attempt in range(attempts):
            try:
                return self._start(timeout_s)
            except StartFailed as exc:
                self.shards = []
                if attempt == attempts - 1 or not ("taken" in exc.reason
                                                   or "Address already in use" in str(exc)):
                    raise
        return self

    def _start(self, timeout_s: float) -> ShardedCluster:
        ports = [self._port(k) for k in range(self.masters)]
        addrs = [f"tcp://{LOOPBACK}:{port}" for port in ports]
        heads = [self.master_port + self.masters + k if self.master_port else free_port()
                 for k in range(self.masters)]
        try:
            for k in range(self.masters):
                args = ["--shard", str(k), "--shards", " ".join(addrs), *self.master_args]
                if self.heads:
                    args += ["--heads-bind", f"tcp://{LOOPBACK}:{heads[k]}"]
                shard = LocalCluster(
                    os.path.join(self.base_dir, f"shard{k}"), datanodes=self.datanodes,
                    replication=self.replication, master_port=ports[k],
                    node_base_port=self.node_base_port + k * self.datanodes
                    if self.node_base_port else None,
                    keys=self.keys, metrics=self.metrics, log_format=self.log_format,
                    heartbeat_s=self.heartbeat_s, dead_after_s=self.dead_after_s,
                    master_args=args, standby=self.standby,
                    standby_args=["--heads-bind", f"tcp://{LOOPBACK}:{free_port()}"]
                    if self.heads else [])
                self.shards.append(shard)
                shard.start(timeout_s)
                self.keys = shard.keys  # AUTO_KEYS is resolved once, shared by all shards
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def addrs(self) -> list[str]:
        """Each shard's masters (``primary,standby``), in shard order: what clients are given."""
        return [shard.masters for shard in self.shards]

    def client(self, **options: Any) -> Any:
        """A sharded ``Client`` of this cluster."""
        from blizzard.client.core import Client
        return Client(self.addrs, **options)

    def kill_master(self, k: int) -> None:
        master = self.shards[k].master
        assert master is not None
        master.kill()

    def restart_master(self, k: int, timeout_s: float = 30.0) -> None:
        """Start shard ``k``'s master again on its WAL (after a kill)."""
        self.shards[k].restart_master(timeout_s)

    def stop(self) -> None:
        for shard in self.shards:
            shard.stop()

    def logs(self) -> str:
        return "\n".join(f"##### shard {k} #####\n{shard.logs()}"
                         for k, shard in enumerate(self.shards))

    def __enter__(self) -> ShardedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
