"""The repair layer: causal delivery, gap fetching, heads anti-entropy and backfill,
with its wire messages (WANT, BLOCKS, HEADS, HEADS_DIGEST, JOINED)."""
