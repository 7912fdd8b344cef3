"""Topic versions: their lineage and the publishing-rights rule, and building the
descriptors that the topic commands create and update."""
