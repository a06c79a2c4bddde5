"""The ``loop-actors`` command line."""
