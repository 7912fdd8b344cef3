"""The commit message a writer task sends back to the driver.

Apart from :mod:`.writer` (the driver's side: planning, commit, abort) and :mod:`.publish`
(the task's side: the HTTP client), since both use it: neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql.datasource import WriterCommitMessage

__all__ = ["PublishedEvents"]


@dataclass
class PublishedEvents(WriterCommitMessage):
    """What one task published: ``cids[i]`` went to ``topics[i]``, in row order; and, if
    it stopped on a failure, the error (which the driver's commit raises)."""

    partition: int
    attempt: int
    topics: list[str] = field(default_factory=list)
    cids: list[str] = field(default_factory=list)
    error: str | None = None
    error_code: str | None = None
