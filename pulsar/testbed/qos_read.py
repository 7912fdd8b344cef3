"""Trace files and manifest expectations as Spark DataFrames, keyed by (run, protocol).

The traces are read once with an explicit schema (inference would scan every file twice and
could guess a field's type differently from one run to the next) and cached, trimmed to the
columns each record kind needs: every metric is then a query over the cache instead of
another parse of the JSON. A line that is not a whole record — the cut last line of a
crashed node — is kept out of the metrics and counted as unreadable.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .report_inputs import RunInput

__all__ = ["KEY", "TRACE_SCHEMA", "UNREADABLE", "expectations", "ordered_topics", "read_traces"]

KEY = ("run", "protocol")
"""Every DataFrame of the job carries these two columns; every aggregation groups by them."""

UNREADABLE = "_unreadable"
"""The ``kind`` given to lines that are not a usable record (cut short, not JSON, no t/node/
kind), so they are counted but take part in no metric."""

_CORRUPT = "_corrupt_record"

TRACE_SCHEMA = T.StructType([
    T.StructField("t", T.DoubleType()),
    T.StructField("node", T.LongType()),
    T.StructField("kind", T.StringType()),
    T.StructField("topic", T.StringType()),
    T.StructField("event", T.StringType()),
    T.StructField("parent", T.StringType()),
    T.StructField("hop", T.LongType()),
    T.StructField("msg", T.StringType()),
    T.StructField("cpu_s", T.DoubleType()),
    T.StructField("rss", T.LongType()),
    T.StructField("sent_bytes", T.LongType()),
    T.StructField("dht_sent_bytes", T.LongType()),
    T.StructField("life", T.LongType()),
    T.StructField(_CORRUPT, T.StringType()),
])
"""The fields of pulsar.testbed.trace the report uses; the others (peer, bytes, recv_bytes,
dht_recv_bytes) are not parsed into columns."""

_KINDS_USING = {
    "topic": ("publish",),
    "parent": ("publish",),
    "event": ("publish", "deliver", "receive", "duplicate"),
    "hop": ("deliver",),
    "msg": ("receive", "duplicate"),
    "cpu_s": ("sample",),
    "rss": ("sample",),
    "sent_bytes": ("sample",),
    "dht_sent_bytes": ("sample",),
    "life": ("sample",),
}
"""Which record kinds keep which column in the cache: the rest is nulled, so the many
``send`` records cost a few bytes each instead of two CIDs and a peer id."""


def read_traces(spark: SparkSession, runs: Sequence[RunInput]) -> DataFrame:
    """All trace records of all runs, persisted: (run, protocol, t, node, kind, …).

    The caller unpersists it. Unusable lines have kind ``UNREADABLE`` and null fields."""
    frames = []
    for run in runs:
        for part in run.protocols:
            raw = (spark.read.schema(TRACE_SCHEMA)
                   .option("mode", "PERMISSIVE")
                   .option("columnNameOfCorruptRecord", _CORRUPT)
                   .json([str(path) for path in part.trace_files]))
            frames.append(_trim(raw, run.label, part.protocol))
    union = reduce(DataFrame.unionByName, frames)
    return union.persist(StorageLevel.MEMORY_AND_DISK)


def _trim(raw: DataFrame, run: str, protocol: str) -> DataFrame:
    usable = (F.col(_CORRUPT).isNull() & F.col("kind").isNotNull()
              & F.col("t").isNotNull() & F.col("node").isNotNull())
    kind = F.when(usable, F.col("kind")).otherwise(F.lit(UNREADABLE))
    columns: list[Column] = [
        F.lit(run).alias("run"), F.lit(protocol).alias("protocol"),
        F.when(usable, F.col("t")).alias("t"), F.when(usable, F.col("node")).alias("node"),
        kind.alias("kind"),
    ]
    for name, kinds in _KINDS_USING.items():
        keep = usable & F.col("kind").isin(*kinds)
        columns.append(F.when(keep, F.col(name)).alias(name))
    return raw.select(*columns)


def expectations(spark: SparkSession, runs: Sequence[RunInput]) -> DataFrame:
    """(run, protocol, topic, subscriber): the manifest's subscriptions, one row each."""
    schema = T.StructType([
        T.StructField("run", T.StringType(), False),
        T.StructField("protocol", T.StringType(), False),
        T.StructField("topic", T.StringType(), False),
        T.StructField("subscriber", T.LongType(), False),
    ])
    rows = [(run.label, part.protocol, topic, subscriber)
            for run in runs for part in run.protocols
            for topic, subscriber in part.subscriptions]
    return spark.createDataFrame(rows, schema)


def ordered_topics(spark: SparkSession, runs: Sequence[RunInput]) -> DataFrame:
    """(run, protocol, topic) of the topics whose manifest entry has ``"order": true``."""
    schema = T.StructType([
        T.StructField("run", T.StringType(), False),
        T.StructField("protocol", T.StringType(), False),
        T.StructField("topic", T.StringType(), False),
    ])
    rows = [(run.label, part.protocol, topic)
            for run in runs for part in run.protocols for topic in sorted(part.ordered_topics)]
    return spark.createDataFrame(rows, schema)
