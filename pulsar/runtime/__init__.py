"""The asyncio side of a node: adapters between the sans-I/O core and real I/O."""
