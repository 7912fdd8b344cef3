"""The tools built on the library: the command line, the Spark data source, the testbed,
the simulator, verify, the benchmarks, the devnet and the doctor.

The library (``dag``, ``dht``, ``api`` and the rest of ``pulsar``) never imports them
(an import-linter contract)."""
