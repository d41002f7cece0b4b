"""The master's pure state: what the WAL records change, with no clock, socket, log or handler."""
