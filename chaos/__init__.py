"""Churn and fault injection against a real Blizzard cluster (see issue: chaos)."""
