"""A data node's settings (one frozen dataclass with documented defaults) and its identity."""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass

from blizzard.net.defaults import DEFAULT_DATANODE, DEFAULT_MASTER
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument


@dataclass(frozen=True, kw_only=True)
class DatanodeConfig:
    """A data node's settings."""

    data_dir: str
    bind: str = DEFAULT_DATANODE
    master: str = DEFAULT_MASTER
    advertise: str | None = None  # the address others use to reach this node; default: bind
    heartbeat_s: float = 1.0
    max_item_bytes: int = 8 * 1024 * 1024
    keys: str | None = None  # key directory (``blizzard keys generate``); None: insecure
    # this node's own key in it (``blizzard keys add-node DIR NAME``); None: the only one there
    node_key: str | None = None
    metrics_port: int | None = None  # Prometheus /metrics on metrics_addr:port; None: off
    metrics_addr: str = "127.0.0.1"
    metrics_allow_hosts: tuple[str, ...] = ()  # Host names /metrics answers to, besides its own
    join_cluster: str = ""  # the cluster an unjoined node holding blobs joins (the operator's word)
    # a copy a peer sent is reported to the master this long after (it deletes what it did
    # not order): longer than a copy's source takes to report it
    copy_confirm_s: float = 30.0
    sync_hold_ms: float = 1.0  # group commit across producers (``blizzard/server/sync_hold.py``)

    def validate(self) -> DatanodeConfig:
        if self.heartbeat_s <= 0:
            raise InvalidArgument("heartbeat-s must be positive")
        if not 0 <= self.sync_hold_ms <= 100:
            raise ValueError("sync_hold_ms must be in [0, 100]")
        if self.copy_confirm_s <= 0:
            raise InvalidArgument("copy-confirm-s must be positive")
        if not 0 < self.max_item_bytes <= p.MAX_ITEM_BYTES:
            raise InvalidArgument(f"max-item-bytes must be between 1 and {p.MAX_ITEM_BYTES}")
        if self.join_cluster and not re.fullmatch(r"[0-9a-f]{16}", self.join_cluster):
            raise InvalidArgument("--join-cluster takes a cluster id: 16 hex digits, as "
                                  "`blizzard status` shows it")
        if ":0" == self.bind[-2:] and self.advertise is None:
            raise InvalidArgument("binding port 0 needs --advertise")
        return self


def load_node_id(data_dir: str) -> str:
    """The node's stable id, created on first start; a wiped disk makes a new node."""
    path = os.path.join(data_dir, "node_id")
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    node_id = "dn-" + uuid.uuid4().hex[:12]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(node_id)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    return node_id
