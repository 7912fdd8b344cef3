"""The one exception the data source raises, with a stable code to branch on.

Spark wraps whatever a Python data source raises into its own exceptions (an
``AnalysisException`` at planning, a ``PythonException`` or ``StreamingQueryException``
from a task) and keeps only the text. So the code is put *in the text*, the way Spark
prints its own error classes — ``[PULSARCAST_TOPIC_NOT_FOUND] ...`` — and a caller can match
on it whatever wrapper it receives. ``docs/spark.md`` lists every code.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CODES", "PulsarcastSparkError"]

CODES: Final = frozenset({
    "MISSING_OPTION",      # a required option is absent
    "INVALID_OPTION",      # an option has a value that cannot be used (or is unknown)
    "INVALID_OFFSETS",     # offsets resolve to a range outside the log, or start > end
    "INVALID_COLUMN",      # a writer input column is missing or of the wrong type
    "INVALID_ROW",         # a row cannot be published (null payload, no topic)
    "UNREACHABLE",         # the node's REST API does not answer
    "TIMEOUT",             # a call to the node took longer than requestTimeout
    "TOPIC_NOT_FOUND",     # the node knows no such topic
    "EVENT_NOT_FOUND",     # an event CID given as an offset is not in the node's log
    "NOT_SUBSCRIBED",      # a stream of a topic the node does not follow
    "CONSUMER_NOT_FOUND",  # the node has no consumer of the name the option gives
    "INVALID_CONSUMER",    # that consumer cannot be read by position (its ack_policy)
    "UNAUTHORIZED",        # missing or wrong token for a call that changes state
    "PUBLISH_FAILED",      # a writer task could not publish a row
    "NODE_ERROR",          # the node answered something else unexpected
})


class PulsarcastSparkError(Exception):
    """``code`` is one of :data:`CODES`; the message starts with ``[PULSARCAST_<code>]``."""

    def __init__(self, code: str, message: str) -> None:
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(f"[PULSARCAST_{code}] {message}")
        self.code = code
        self.detail = message

    def __reduce__(self) -> tuple[type[PulsarcastSparkError], tuple[str, str]]:
        # Raised in Spark's Python workers and pickled back: keep both arguments.
        return (type(self), (self.code, self.detail))
