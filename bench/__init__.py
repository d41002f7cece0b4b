"""Benchmarks against a local cluster: ``throughput`` (scripts/bench) and ``restart``
(scripts/bench-restart). Not part of the library: nothing in ``blizzard/`` imports them."""
