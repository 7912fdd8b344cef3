"""Benchmarks behind ``pulsarcast bench NAME``: each prints one JSON line of figures.

Every benchmark measures its baseline in the same process and run, so ratios are not skewed
by the machine's mood. Methods and the figures seen are recorded in ``docs/evaluation.md``.
"""
