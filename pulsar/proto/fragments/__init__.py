"""Large events along the tree: fragments relayed as they arrive, IDONTWANT,
staggered and paced sends, bounded partial state, and their settings and messages."""
