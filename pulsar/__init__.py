"""pulsar."""
