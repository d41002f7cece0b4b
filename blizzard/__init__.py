"""Blizzard: a distributed, durable, replicated work queue. Its public names are here.

Floors, each importing only those below (``.importlinter``; docs/architecture.md): ``wire``
(messages, codec, errors) < ``net`` (ZeroMQ, CURVE, keys) < ``client`` | ``server`` (what only
the master and the data nodes use) < ``worker`` | ``dispatch`` | ``dashboard`` | ``spark`` |
``local`` (clusters of processes on this machine) < ``cli``.
"""

from __future__ import annotations

from blizzard.client.api import BlizzardClient, connect
from blizzard.client.core import Client, Message
from blizzard.wire.errors import (
                                  BlizzardError,
                                  ClientClosed,
                                  ClusterError,
                                  DataCorrupt,
                                  DatanodeUnavailable,
                                  InvalidArgument,
                                  LeaseExpired,
                                  MasterUnavailable,
                                  NotEnoughDatanodes,
                                  NotInQueue,
                                  PayloadTooLarge,
                                  ProtocolError,
                                  RequestError,
                                  UnknownItem,
                                  WrongLease,
)
from blizzard.wire.release import RELEASE
from blizzard.worker.context import (
                                  Cancelled,
                                  cancel_requested,
                                  cancelled,
                                  current_job,
                                  current_tick,
                                  last_state,
                                  progress,
)
from blizzard.worker.results import JobCancelled, JobFailed, JobHandle, ResultUnavailable
from blizzard.worker.task import configure, group, task

__all__ = ["connect", "BlizzardClient", "Client", "Message", "task", "configure",
           "progress", "cancelled", "cancel_requested", "last_state", "current_job",
           "current_tick", "Cancelled",
           "JobHandle", "JobFailed", "JobCancelled", "ResultUnavailable", "group",
           "BlizzardError", "ClientClosed",
           "ClusterError", "DataCorrupt", "DatanodeUnavailable", "InvalidArgument",
           "LeaseExpired", "MasterUnavailable", "NotEnoughDatanodes", "NotInQueue",
           "PayloadTooLarge", "ProtocolError", "RequestError", "UnknownItem", "WrongLease"]
__version__ = RELEASE  # setup.cfg's version, from the installed metadata
