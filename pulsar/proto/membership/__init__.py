"""The node-wide membership overlay (HyParView with proximity-aware active links),
with its wire messages and topic interests."""
