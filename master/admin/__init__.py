"""Operator requests: queue administration, cluster status, removals."""
