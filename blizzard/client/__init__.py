"""The Python client: ``Client`` (``core``), its master link and data-node pool,
the enqueue pipeline, leases and settling; ``sharded``: a client of several masters.

Uses ``blizzard.wire`` and ``blizzard.net``; nothing of the servers.
"""

from blizzard.client.core import Client, Message, ShardedClient  # the path before the packages

__all__ = ["Client", "Message", "ShardedClient"]
