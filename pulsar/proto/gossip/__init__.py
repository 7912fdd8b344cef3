"""Plumtree lazy repair over the trees, with its wire messages (IHAVE, GRAFT,
PRUNE, SHUFFLE)."""
