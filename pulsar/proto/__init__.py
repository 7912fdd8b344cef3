"""Sans-I/O protocol cores: plain state machines, inputs in, outputs out.

Nothing here touches sockets, clocks or the event loop: ``now`` and the random source are
passed in, and fetches, stores, sends and timers are *outputs* the driver carries out. The
asyncio runtime (``pulsar.node``) and the simulator drive the very same objects.
"""
