"""The master's log: the write-ahead log, checkpoints, recovery and read-only inspection."""
