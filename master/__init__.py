"""The Blizzard master: queue metadata, ids, placement, leases and the write-ahead log."""
