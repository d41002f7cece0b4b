"""The Blizzard data node: payload blobs in LevelDB, replication, heartbeats."""
