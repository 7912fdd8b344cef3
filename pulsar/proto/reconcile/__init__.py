"""Range-based set reconciliation of a topic's history between two neighbours: the item
index, the RECON / RWANT / RBLOCKS messages, and the pure step that answers one message."""
