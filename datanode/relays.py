"""Producers' enqueues a data node passes on to the master (docs/design.md "Data path").

A producer's ``Put`` may carry its ``Enqueue`` (``Put.relay``), signed by the producer with
its placement's key: the node passes it on untouched in the pass's ``PutReport``, after the
payloads are synced, and the master serves it as the producer's request
(``master/relays.py``). The node checks only the shape; the master checks the signature.
"""

from __future__ import annotations

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.push_signature import MAC_BYTES
from blizzard.wire.relay_signature import REPLY_TO_BYTES

MAX_RELAY_BYTES = 1024 * 1024  # one relayed enqueue's frame (a client relays up to 64 KiB)
MAX_RELAYED = 512  # relayed enqueues in one report (master/relays.py takes no more)
REPORT_RELAY_BYTES = 4 * 1024 * 1024  # ... and their bytes (the master takes 8 MiB a request)


def check_relay(relay: p.Relay, report: bool) -> None:
    """``InvalidArgument`` unless ``relay`` may be passed on: a put that reports to the
    master, a routing id and a signature of their sizes, a frame within bounds."""
    if not report:
        raise InvalidArgument("only a put that reports to the master relays an enqueue")
    if len(relay.reply_to) != REPLY_TO_BYTES or len(relay.mac) != MAC_BYTES:
        raise InvalidArgument(f"a relayed enqueue names a routing id of {REPLY_TO_BYTES} bytes "
                              f"and a signature of {MAC_BYTES}")
    if not relay.frame or len(relay.frame) > MAX_RELAY_BYTES:
        raise InvalidArgument(f"a relayed enqueue is 1 to {MAX_RELAY_BYTES} bytes")


def relay_groups(relays: list[p.Relay]) -> list[list[p.Relay]]:
    """``relays`` cut into groups for one report each, at most ``MAX_RELAYED`` and about
    ``REPORT_RELAY_BYTES`` a group, the first group last (callers ``pop`` them)."""
    groups: list[list[p.Relay]] = []
    size = 0
    for relay in relays:
        if not groups or len(groups[-1]) >= MAX_RELAYED or \
                size + len(relay.frame) > REPORT_RELAY_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(relay)
        size += len(relay.frame)
    groups.reverse()
    return groups
