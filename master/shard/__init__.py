"""Sharding: a shard's heads feed and who subscribes to it."""
