"""Blizzard: a distributed, durable, replicated work queue."""

from __future__ import annotations

from blizzard.client import Client, Message
from blizzard.errors import (BlizzardError, ClientClosed, ClusterError, DataCorrupt,
                             DatanodeUnavailable, InvalidArgument, LeaseExpired,
                             MasterUnavailable, NotEnoughDatanodes, PayloadTooLarge,
                             ProtocolError, RequestError)
from blizzard.task import configure, task

__all__ = ["Client", "Message", "task", "configure", "BlizzardError", "ClientClosed",
           "ClusterError", "DataCorrupt", "DatanodeUnavailable", "InvalidArgument",
           "LeaseExpired", "MasterUnavailable", "NotEnoughDatanodes", "PayloadTooLarge",
           "ProtocolError", "RequestError"]
__version__ = "0.1.0"
