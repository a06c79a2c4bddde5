"""Workers that claim submitted invocations from the queue and drive them."""
