"""Enqueues a data node passes on for their producers (docs/design.md "Data path", Enqueue).

A producer may send its ``Enqueue`` along with its payloads to the first placed data node
(``Put.relay``) instead of to the master: that node passes it on in its next ``PutReport``,
so one message of the producer and one received by the master go, per enqueue. The master
serves a relayed enqueue as the producer's own request, from the producer's connection (the
answer goes to ``reply_to``, which must be the connection that asked for the placement),
with the role and key that connection placed the ids with; only under the signature of that
placement's key (``blizzard/wire/relay_signature.py``), which data nodes never see, checked
before the frame is decoded. A relay that fails the check is dropped and counted, and so is
one whose request the master already has from the producer itself (waiting, landed or
refused: the producer sent it after its wait for the relay ran out, ``blizzard/client/
pipeline.py``), so a late relay never takes over an answer nor lands after a refusal.
"""

from __future__ import annotations

import collections
import hmac
import logging
from typing import Callable

from blizzard.net.log_limit import Throttled
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.push_signature import MAC_BYTES
from blizzard.wire.relay_signature import REPLY_TO_BYTES, sign
from master.id_blocks import Blocks

log = logging.getLogger(__name__)
dropped = Throttled(log)  # a node may send anything: a line per 10 s

MAX_RELAYED = 512  # relayed enqueues in one put report (a node's pass takes 512 requests)
MAX_REFUSED = 16_384  # request ids of refused enqueues remembered (a late relay's)


class Relays:
    """Relayed enqueues taken from the put reports of a pass, opened for serving."""

    def __init__(self, blocks: Blocks) -> None:
        self.blocks = blocks
        self.waiting: list[tuple[str, p.Relay]] = []  # (node id, relay), in arrival order
        self.counts = {"taken": 0, "dropped": 0}
        # enqueues refused when their producer sent them itself: a relay of one comes late
        self.refused: collections.OrderedDict[str, None] = collections.OrderedDict()

    def add(self, node_id: str, relayed: list[p.Relay]) -> None:
        """A data node's report carried these (it speaks for ``node_id``: checked before)."""
        if len(relayed) > MAX_RELAYED:
            raise InvalidArgument(f"a put report relays at most {MAX_RELAYED} enqueues")
        self.waiting += [(node_id, relay) for relay in relayed]

    def refuse(self, request: str) -> None:
        """The producer's own enqueue ``request`` was refused: no relay of it is served."""
        self.refused[request] = None
        if len(self.refused) > MAX_REFUSED:
            self.refused.popitem(last=False)

    def take(self, known: Callable[[str], bool]) -> list[tuple[bytes, int, p.Enqueue, str]]:
        """The relays added since the last call that pass the check and whose request is not
        ``known`` (waiting or landed), as requests to serve: (the producer's routing id, its
        request id, its enqueue, "ROLE:KEY" of its placement)."""
        waiting, self.waiting = self.waiting, []
        opened = []
        for node_id, relay in waiting:
            request = self.open(relay)
            if request is not None and (known(request[2].request)
                                        or request[2].request in self.refused):
                request = None  # the producer's own copy came first: it has the answer
            if request is None:
                self.counts["dropped"] += 1
                dropped("relay", "dropped an enqueue relayed by %s: not signed with the key of "
                        "its placement, or late (its ids are no longer handed out, or its "
                        "producer sent it itself)", node_id[:64])
                continue
            self.counts["taken"] += 1
            opened.append(request)
        return opened

    def open(self, relay: p.Relay) -> tuple[bytes, int, p.Enqueue, str] | None:
        """The request in ``relay`` if it is an enqueue signed with the key of the placement
        of its first id, answered to the connection that asked for that placement (None:
        anything else). The signature is checked before the frame is decoded."""
        if len(relay.reply_to) != REPLY_TO_BYTES or len(relay.mac) != MAC_BYTES:
            return None
        block = self.blocks.by_id.get(relay.first)
        if block is None or not block.relay_key or block.peer != relay.reply_to or \
                not hmac.compare_digest(sign(block.relay_key, relay.reply_to, relay.frame),
                                        relay.mac):
            return None
        try:
            rid, msg = p.decode(relay.frame)
        except Exception:  # ProtocolError; anything else a codec bug: never the master's end
            return None
        if type(msg) is not p.Enqueue or not msg.ids or msg.ids[0] != relay.first or not rid:
            return None
        return relay.reply_to, rid, msg, block.who
