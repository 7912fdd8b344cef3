"""A PySpark data source for pulsarcast (Spark 4 Python data source API).

``spark.dataSource.register(PulsarcastDataSource)``, then ``format("pulsarcast")``:
a topic's history as a DataFrame (``spark.read``), its live events as a stream
(``spark.readStream``), and rows published as events (``df.write`` / ``writeStream``).
Everything goes through a node's REST API (``api/``), so the node can be anywhere the Spark
executors can reach. ``docs/spark.md`` has the options, the schema and the semantics.

Needs the ``spark`` extra: ``pip install 'pulsarcast[spark]'``.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("pulsar.tools.spark needs PySpark 4 and pyarrow: pip install "
                      "'pulsarcast[spark]'") from exc

from .commit import PublishedEvents
from .errors import PulsarcastSparkError
from .schema import SCHEMA
from .source import PulsarcastDataSource

__all__ = ["SCHEMA", "PublishedEvents", "PulsarcastDataSource", "PulsarcastSparkError"]
