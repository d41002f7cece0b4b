"""Blizzard: a distributed, durable, replicated work queue."""

from __future__ import annotations

from blizzard.client import Client, Message
from blizzard.errors import (BlizzardError, ClientClosed, ClusterError, DataCorrupt,
                             DatanodeUnavailable, InvalidArgument, LeaseExpired,
                             MasterUnavailable, NotEnoughDatanodes, NotInQueue,
                             PayloadTooLarge, ProtocolError, RequestError, UnknownItem,
                             WrongLease)
from blizzard.task import configure, task

__all__ = ["Client", "Message", "task", "configure", "BlizzardError", "ClientClosed",
           "ClusterError", "DataCorrupt", "DatanodeUnavailable", "InvalidArgument",
           "LeaseExpired", "MasterUnavailable", "NotEnoughDatanodes", "NotInQueue",
           "PayloadTooLarge", "ProtocolError", "RequestError", "UnknownItem", "WrongLease"]
__version__ = "0.1.0"
