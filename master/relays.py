"""Enqueues a data node passes on for their producers (docs/design.md "Data path", Enqueue).

A producer may send its ``Enqueue`` along with its payloads to the first placed data node
(``Put.relay``) instead of to the master: that node puts the payloads on the other placed
nodes and passes the enqueue on in its next ``PutReport``, so one message of the producer
and one received by the master go, per enqueue. The master serves a relayed enqueue as the
producer's own request, from the producer's connection (the answer goes to ``reply_to``),
with the role and key that connection asked for the ids' placement with; only under the
signature of that placement's key (``blizzard/wire/relay_signature.py``), which data nodes
never see. A relay that fails the check is dropped and counted: its producer, answered by
nobody, sends the enqueue to the master itself after a short wait
(``blizzard/client/pipeline.py``), as it does when a relaying node dies.
"""

from __future__ import annotations

import hmac
import logging

from blizzard.net.log_limit import Throttled
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument, ProtocolError
from blizzard.wire.push_signature import MAC_BYTES
from blizzard.wire.relay_signature import REPLY_TO_BYTES, sign
from master.id_blocks import Blocks

log = logging.getLogger(__name__)
dropped = Throttled(log)  # a node may send anything: a line per 10 s

MAX_RELAYED = 512  # relayed enqueues in one put report (a node's pass takes 512 requests)


class Relays:
    """Relayed enqueues taken from the put reports of a pass, opened for serving."""

    def __init__(self, blocks: Blocks) -> None:
        self.blocks = blocks
        self.waiting: list[tuple[str, p.Relay]] = []  # (node id, relay), in arrival order
        self.counts = {"taken": 0, "dropped": 0}

    def add(self, node_id: str, relayed: list[p.Relay]) -> None:
        """A data node's report carried these (it speaks for ``node_id``: checked before)."""
        if len(relayed) > MAX_RELAYED:
            raise InvalidArgument(f"a put report relays at most {MAX_RELAYED} enqueues")
        self.waiting += [(node_id, relay) for relay in relayed]

    def take(self) -> list[tuple[bytes, int, p.Enqueue, str]]:
        """The relays added since the last call that pass the check, as requests to serve:
        (the producer's routing id, its request id, its enqueue, "ROLE:KEY" of its placement)."""
        waiting, self.waiting = self.waiting, []
        opened = []
        for node_id, relay in waiting:
            request = self.open(relay)
            if request is None:
                self.counts["dropped"] += 1
                dropped("relay", "dropped an enqueue relayed by %s: not signed with the key of "
                        "its placement (forged, damaged, or its ids are no longer handed out)",
                        node_id[:64])
                continue
            self.counts["taken"] += 1
            opened.append(request)
        return opened

    def open(self, relay: p.Relay) -> tuple[bytes, int, p.Enqueue, str] | None:
        """The request in ``relay`` if it is an enqueue signed with the key of the placement
        of its first id (None: anything else)."""
        if len(relay.reply_to) != REPLY_TO_BYTES or len(relay.mac) != MAC_BYTES:
            return None
        try:
            rid, msg = p.decode(relay.frame)
        except ProtocolError:
            return None
        if type(msg) is not p.Enqueue or not msg.ids or not rid:
            return None
        block = self.blocks.by_id.get(msg.ids[0])
        if block is None or not block.relay_key or \
                not hmac.compare_digest(sign(block.relay_key, relay.reply_to, relay.frame),
                                        relay.mac):
            return None
        return relay.reply_to, rid, msg, block.who
