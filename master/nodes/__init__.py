"""The data nodes as the master sees them: membership, safe mode, repair, blob deletes, keys,
grants, reports."""
