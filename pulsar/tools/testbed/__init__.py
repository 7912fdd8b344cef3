"""The testbed: real networks of nodes under injected faults, traces, and the QoS report.

``pulsarcast testbed run SCENARIO`` runs a scenario file (``scenarios/``) for Pulsarcast and
for the Floodsub baseline on the same workload and faults, writing a run directory of
traces (:mod:`pulsar.tools.testbed.trace`) and a manifest (:mod:`pulsar.tools.testbed.manifest`);
``pulsarcast report RUN_DIR...`` turns run directories into figures with PySpark
(:mod:`pulsar.tools.testbed.report`).
"""
