"""Default addresses, one definition each: the client, the CLI and the Spark source use them."""

from __future__ import annotations

LOOPBACK = "127.0.0.1"
MASTER_PORT = 5555
DATANODE_PORT = 5601  # the first data node's; ``blizzard cluster`` counts up from it
DEFAULT_MASTER = f"tcp://{LOOPBACK}:{MASTER_PORT}"
DEFAULT_DATANODE = f"tcp://{LOOPBACK}:{DATANODE_PORT}"
