"""Producing: item ids, placements (id blocks on data nodes) and enqueues with their checks."""
