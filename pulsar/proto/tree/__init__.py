"""The dissemination tree of a topic: join routing, parents and children (paper,
algorithm 2), its wire messages (JOIN, LEAVE, EVENT, REQUEST_TO_PUBLISH, PING, PONG) and
the round-trip times measured with PING/PONG that pace every wait of the protocol."""
