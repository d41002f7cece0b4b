"""The Python client: ``connect`` and the interface both clients implement (``api``),
``Client`` (``core``), its master link and data-node pool, the enqueue pipeline, leases and
settling, the lease keeper of workers and dispatchers (``lease_keeper``); ``sharded``: a
client of several masters.

Uses ``blizzard.wire`` and ``blizzard.net``; nothing of the servers.
"""

from blizzard.client.api import BlizzardClient, connect
from blizzard.client.core import Client, Message, ShardedClient  # the path before the packages

__all__ = ["BlizzardClient", "Client", "Message", "ShardedClient", "connect"]
