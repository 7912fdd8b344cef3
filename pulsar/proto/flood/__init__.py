"""Floodsub, the baseline Pulsarcast is measured against, and its one message
(SUBS)."""
