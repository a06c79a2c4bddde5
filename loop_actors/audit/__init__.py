"""Audit of the history: verification, signed checkpoints, the checkpointer, store copies."""
