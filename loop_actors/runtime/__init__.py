"""The runtime: the Runtime, the Controller that drives a turn, batches, leases and work slots."""
