"""Trace files and manifest expectations as Spark DataFrames, keyed by (run, protocol).

The traces are parsed once, with an explicit schema (inference would scan every file twice
and could guess a field's type differently from one run to the next), and folded in the same
pass into one row per fact the metrics use — an event published or delivered at a node, the
copies of an event, a node's life, a count — which is kept in memory. Two million records of
a 100-node run fold into about a quarter of a million rows, so every metric after that is a
query over a small table instead of another parse of the JSON. A line that is not a whole
record — the cut last line of a crashed node — is kept out of the metrics and counted as
unreadable.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .report_inputs import ProtocolRun, RunInput

__all__ = [
    "KEY",
    "TRACE_SCHEMA",
    "UNREADABLE",
    "durable_deliveries",
    "expectations",
    "ordered_topics",
    "fold_traces",
    "parts",
]

KEY = ("part",)
"""Every DataFrame of the job carries these columns and every aggregation groups by them:
``part`` numbers the (run, protocol) pairs in the order of :func:`parts`. A small integer
rather than the two names, because it is hashed and compared on each of millions of rows."""

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
"""The fields of pulsar.tools.testbed.trace the report uses; the others (peer, bytes, recv_bytes,
dht_recv_bytes) are not parsed into columns."""

_KINDS_USING = {
    "node": ("publish", "deliver", "receive", "sample"),
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
"""Which record kinds keep which column: the rest is nulled before folding, so that, e.g.,
all ``send`` records of a protocol fold into one row and the duplicates of an event into one
row per ``msg``, whichever node took them. A ``receive`` keeps its node: it is the first copy
at that node, and how it came is the route of that node's delivery (:mod:`.qos_routes`)."""

_FACT = ("kind", "node", "event", "msg", "life")
"""The fold's grouping columns besides ``part`` (nulled ones group together)."""

_HASHED = ("event", "parent")
"""Event CIDs are only ever compared, never shown, so they are folded as 64-bit xxhash64
values: a quarter of the memory of the 59-character text and cheaper joins. Two of the
run's few thousand events colliding has a probability around n^2 / 2^65 (10^-11 for ten
thousand events)."""


def parts(runs: Sequence[RunInput]) -> list[tuple[RunInput, ProtocolRun]]:
    """The (run, protocol) pairs of ``runs``; a pair's index in this list is its ``part``."""
    return [(run, part) for run in runs for part in run.protocols]


def fold_traces(spark: SparkSession, runs: Sequence[RunInput]) -> DataFrame:
    """The traces of all runs, parsed and folded now: one row per fact, with columns (part,
    kind, node, event, msg, life, records, t, hop, topic, parent, last, rss). By kind:

    * ``publish``, ``deliver``: one row per (node, event); ``t`` is the first record's time
      and ``hop``, ``topic``, ``parent`` are that record's.
    * ``receive``: one row per (node, event, msg); ``t`` is the first record's time.
    * ``duplicate``: one row per (event, msg), all nodes together; ``records`` is the number
      of copies.
    * ``sample``: one row per (node, life); ``last`` is (sent_bytes, dht_sent_bytes, cpu_s) of
      the life's latest sample and ``rss`` its largest.
    * any other kind, and ``UNREADABLE`` (unusable lines): one row; ``records`` counts them.

    The table is a local checkpoint rather than a cache: building Spark's columnar cache cost
    more than the parse itself here. Its blocks are freed when the DataFrame is garbage
    collected or the session stops."""
    frames = []
    for index, (_, part) in enumerate(parts(runs)):
        raw = (spark.read.schema(TRACE_SCHEMA)
               .option("mode", "PERMISSIVE")
               .option("columnNameOfCorruptRecord", _CORRUPT)
               .json([str(path) for path in part.trace_files]))
        frames.append(_trim(raw, index))
    folded = reduce(DataFrame.unionByName, frames).groupBy(*KEY, *_FACT).agg(
        F.count("*").alias("records"),
        F.min("t").alias("t"),
        F.min_by("hop", "t").alias("hop"),
        F.min_by("topic", "t").alias("topic"),
        F.min_by("parent", "t").alias("parent"),
        F.max_by(F.struct("sent_bytes", "dht_sent_bytes", "cpu_s"), "t").alias("last"),
        F.max("rss").alias("rss"),
    )
    return folded.localCheckpoint(eager=True)


def _trim(raw: DataFrame, index: int) -> DataFrame:
    usable = (F.col(_CORRUPT).isNull() & F.col("kind").isNotNull()
              & F.col("t").isNotNull() & F.col("node").isNotNull())
    kind = F.when(usable, F.col("kind")).otherwise(F.lit(UNREADABLE))
    columns: list[Column] = [
        F.lit(index).alias("part"), F.when(usable, F.col("t")).alias("t"), kind.alias("kind"),
    ]
    for name, kinds in _KINDS_USING.items():
        keep = usable & F.col("kind").isin(*kinds)
        value = F.xxhash64(name) if name in _HASHED else F.col(name)
        columns.append(F.when(keep & F.col(name).isNotNull(), value).alias(name))
    return raw.select(*columns)


def expectations(spark: SparkSession, runs: Sequence[RunInput]) -> DataFrame:
    """(part, topic, subscriber): the manifest's subscriptions, one row each."""
    schema = T.StructType([
        T.StructField("part", T.IntegerType(), False),
        T.StructField("topic", T.StringType(), False),
        T.StructField("subscriber", T.LongType(), False),
    ])
    rows = [(index, topic, subscriber) for index, (_, part) in enumerate(parts(runs))
            for topic, subscriber in part.subscriptions]
    return spark.createDataFrame(rows, schema)


def durable_deliveries(spark: SparkSession,
                       runs: Sequence[RunInput]) -> tuple[DataFrame, DataFrame]:
    """From the durable delivery logs: (part, node, event) of every entry, the event hashed
    like the traces' (:data:`_HASHED`), and (part, node) of every node whose log was read.
    Parts without delivery logs have rows in neither."""
    entry_schema = T.StructType([
        T.StructField("part", T.IntegerType(), False),
        T.StructField("node", T.LongType(), False),
        T.StructField("event", T.StringType(), False),
    ])
    node_schema = T.StructType([
        T.StructField("part", T.IntegerType(), False),
        T.StructField("node", T.LongType(), False),
    ])
    entries, nodes = [], []
    for index, (_, part) in enumerate(parts(runs)):
        logs = part.delivery_logs
        if logs is None:
            continue
        entries += [(index, node, event) for node, event in logs.entries]
        nodes += [(index, node) for node in sorted(logs.nodes)]
    logged = (spark.createDataFrame(entries, entry_schema)
              .select(*KEY, "node", F.xxhash64("event").alias("event")))
    return logged, spark.createDataFrame(nodes, node_schema)


def ordered_topics(spark: SparkSession, runs: Sequence[RunInput]) -> DataFrame:
    """(part, topic) of the topics whose manifest entry has ``"order": true``."""
    schema = T.StructType([
        T.StructField("part", T.IntegerType(), False),
        T.StructField("topic", T.StringType(), False),
    ])
    rows = [(index, topic) for index, (_, part) in enumerate(parts(runs))
            for topic in sorted(part.ordered_topics)]
    return spark.createDataFrame(rows, schema)
