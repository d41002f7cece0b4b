"""Local clusters: a master and data nodes as processes on this machine, on
loopback (``harness``; sharded: ``shard_cluster``). ``blizzard cluster``, the tests, the
benches and the chaos runs start clusters through it.

Uses the client, ``net`` and ``wire``; starts the servers as processes, never imports them.
"""
