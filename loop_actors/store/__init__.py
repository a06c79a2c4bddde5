"""The event store and what lives beside it: recorders, journal, reads, queue, secrets, views."""
