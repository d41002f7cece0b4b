"""The master a data node obeys: the primary among the masters it was given, by epoch.

A node given several masters (``--master tcp://a,tcp://b``) heartbeats to one at a time. It
moves on when that one is silent or answers ``NotPrimary`` (a standby), and it obeys no master
of an epoch older than one it has seen: a primary that was cut off and replaced cannot order a
delete or a copy after the new one took over (``master/ha/wal_shipping.py`` fences it too).
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from blizzard.net.keys import ClientKeys
from blizzard.net.masters import MasterChoice
from blizzard.net.transport import Endpoint
from blizzard.wire import protocol as p

log = logging.getLogger(__name__)


class Leader:
    """The endpoint of the master this node heartbeats to, and the newest epoch seen."""

    def __init__(self, ctx: zmq.Context, masters: str, keys: ClientKeys | None) -> None:
        self.ctx = ctx
        self.keys = keys
        self.choice = MasterChoice(masters)
        self.epoch = 0
        self.epoch_proof = b""  # the masters' proof of ``epoch`` (master/ha/epoch_proof.py)
        self.endpoint = self._connect()

    def _connect(self) -> Endpoint:
        return Endpoint(self.ctx, self.choice.current, self.keys,
                        self.keys.master if self.keys else None)

    def _switch(self, moved: bool) -> None:
        if moved:
            self.endpoint.close()
            self.endpoint = self._connect()
            log.info("heartbeating to master %s now", self.choice.current)

    def silent(self) -> None:
        """The last heartbeat went unanswered."""
        self.endpoint.reset()
        self._switch(self.choice.timed_out())

    def accepts(self, reply: Any) -> bool:
        """False for a standby's refusal or a master of an older epoch (and move on)."""
        if isinstance(reply, p.Error) and reply.code == "not_primary":
            self._switch(self.choice.not_primary())
            return False
        if isinstance(reply, p.HeartbeatReply) and reply.epoch < self.epoch:
            log.warning("master %s is of epoch %d, older than %d: not obeying it",
                        self.choice.current, reply.epoch, self.epoch)
            self._switch(self.choice.not_primary())
            return False
        return True

    def learn(self, reply: p.HeartbeatReply) -> None:
        """The epoch of a reply of this node's own cluster (a foreign one teaches nothing)."""
        if reply.epoch > self.epoch or (reply.epoch == self.epoch and not self.epoch_proof):
            self.epoch, self.epoch_proof = reply.epoch, reply.epoch_proof

    def close(self) -> None:
        self.endpoint.close()
