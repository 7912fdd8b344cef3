"""``pulsarcast verify``: the promises checked from outside, Jepsen-style.

Real ``pulsarcast node`` processes, each in its own Linux network namespace, faults made
by the kernel and the OS on a seeded schedule, a workload driven only through the REST API,
a history of what clients were told, and a checker that reads only that history.
See ``docs/verification.md``.
"""
