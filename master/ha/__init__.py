"""High availability: WAL shipping to a standby, the standby itself, epochs, rebuild from the data
nodes."""
