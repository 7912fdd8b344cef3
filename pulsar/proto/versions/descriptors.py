"""Building topic descriptors for the topic commands (paper, algorithm 1), shared by the
Pulsarcast and Floodsub cores so both create and update topics by the same rules.

Two rules live here. A topic's **meta topic** allows only the topic's author to publish
(``allowedPublishers`` enabled with an empty list: the author always may), so nobody else
can announce versions or make every subscriber fetch what a meta event names. A **new
version** links the latest as ``parent``, keeps the meta topic, and records the topic's
heads at that moment (see :mod:`pulsar.proto.versions.lineage` for why).
"""

from __future__ import annotations

from collections.abc import Iterable

from dag import CID, Identity, PublishRule, TopicDescriptor
from pulsar.proto.events import CreateTopic, TopicChanges

__all__ = ["build_topic", "build_version"]


def build_topic(
    identity: Identity, cmd: CreateTopic, now: float
) -> tuple[TopicDescriptor, TopicDescriptor]:
    """``(meta, topic)`` for a ``CreateTopic``; raises ``InvalidDescriptor`` (a
    ``ValueError``) for settings the schema refuses."""
    meta = TopicDescriptor.create(
        identity, f"{cmd.name}/meta", allowed_publishers=PublishRule(True, ()), now=now
    )
    topic = TopicDescriptor.create(
        identity,
        cmd.name,
        meta=meta.cid,
        subtopics=dict(cmd.subtopics),
        allowed_publishers=cmd.allowed_publishers,
        request_to_publish=cmd.request_to_publish,
        event_linking=cmd.event_linking,
        retention=cmd.retention,
        now=now,
    )
    return meta, topic


def build_version(
    identity: Identity,
    current: TopicDescriptor,
    changes: TopicChanges,
    heads: Iterable[CID],
    now: float,
) -> TopicDescriptor:
    """The version after ``current`` with ``changes`` applied, recording ``heads``."""
    subtopics = dict(current.subtopics if changes.subtopics is None else changes.subtopics)
    subtopics.pop("meta", None)
    return TopicDescriptor.create(
        identity,
        current.name if changes.name is None else changes.name,
        meta=current.meta,
        parent=current.cid,
        subtopics=subtopics,
        allowed_publishers=(
            current.allowed_publishers
            if changes.allowed_publishers is None
            else changes.allowed_publishers
        ),
        request_to_publish=(
            current.request_to_publish
            if changes.request_to_publish is None
            else changes.request_to_publish
        ),
        event_linking=(
            current.event_linking if changes.event_linking is None else changes.event_linking
        ),
        heads=heads,
        retention=(
            None if changes.keep_all
            else current.retention if changes.retention is None
            else changes.retention
        ),
        now=now,
    )
