"""A network laboratory on one Linux host: network namespaces joined by bridges
(:mod:`.netns`) and faults made by the kernel on their links (:mod:`.linkfaults`, with the
NFQUEUE shaper :mod:`.nfqueue` where the kernel has no netem).

Used by ``pulsarcast verify`` (:mod:`pulsar.tools.verify`) and by testbed runs in namespaces
(:mod:`pulsar.tools.testbed`); it imports nothing else of pulsarcast."""
