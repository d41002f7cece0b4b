"""Consuming: leases (take, ack, nack, extend, expire) and leases answered by a data node."""
