"""A client of a sharded queue: several masters, each a whole cluster holding
part of every queue (``client``), the shard a lease goes to (``pick``), what it knows of
each shard's head (``view``), writes and acks spread over shards.

Uses ``blizzard.client`` and what it uses.
"""
