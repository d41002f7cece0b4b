"""A data node's settings: one frozen dataclass with documented defaults."""

from __future__ import annotations

from dataclasses import dataclass

from blizzard import protocol as p
from blizzard.defaults import DEFAULT_DATANODE, DEFAULT_MASTER
from blizzard.errors import InvalidArgument


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

    def validate(self) -> "DatanodeConfig":
        if self.heartbeat_s <= 0:
            raise InvalidArgument("heartbeat-s must be positive")
        if not 0 < self.max_item_bytes <= p.MAX_ITEM_BYTES:
            raise InvalidArgument(f"max-item-bytes must be between 1 and {p.MAX_ITEM_BYTES}")
        if ":0" == self.bind[-2:] and self.advertise is None:
            raise InvalidArgument("binding port 0 needs --advertise")
        return self
