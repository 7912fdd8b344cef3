"""Topic settings as the API takes them, turned into the core's commands.

``Node.create_topic`` and ``Node.update_topic`` accept what is convenient to write (peer
ids as strings, a list of peers or a bool for a rule, linking by name, subtopics as a
dict); the core's ``CreateTopic`` and ``UpdateTopic`` take exact, immutable types. The
conversion lives here, apart from the node, so that each setting is read the same way by
both commands.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dag import CID, EventLinking, PeerId, PublishRule, Retention

from ..proto import events as ev

__all__ = ["SETTINGS", "check_settings", "create_topic", "topic_changes"]

SETTINGS = frozenset(
    {"name", "allowed_publishers", "request_to_publish", "event_linking", "subtopics",
     "retention"}
)
"""What ``update_topic`` may change."""


def create_topic(
    request: int,
    name: str,
    allowed_publishers: Iterable[PeerId | str] | None,
    request_to_publish: Iterable[PeerId | str] | bool | None,
    event_linking: EventLinking | str,
    subtopics: dict[str, CID] | None,
    retention: Retention | Mapping[str, int] | None = None,
) -> ev.CreateTopic:
    """The core's command for ``Node.create_topic``'s arguments (``ValueError`` for peer
    ids, a linking or a retention policy that do not parse)."""
    peers = _peers(allowed_publishers)
    return ev.CreateTopic(
        request,
        name,
        None if peers is None else tuple(peers),
        _rule_arg(request_to_publish),
        EventLinking(event_linking),
        tuple((subtopics or {}).items()),
        _retention(retention),
    )


def check_settings(changes: Mapping[str, Any]) -> None:
    """Refuse (``TypeError``) settings ``update_topic`` does not know, before any work."""
    unknown = set(changes) - SETTINGS
    if unknown:
        raise TypeError(f"unknown topic settings: {sorted(unknown)}")


def topic_changes(changes: Mapping[str, Any]) -> ev.TopicChanges:
    """What ``update_topic(**changes)`` changes; a setting not given is kept."""
    linking = changes.get("event_linking")
    subtopics = changes.get("subtopics")
    return ev.TopicChanges(
        name=changes.get("name"),
        allowed_publishers=(
            _rule(changes["allowed_publishers"], False)
            if "allowed_publishers" in changes
            else None
        ),
        request_to_publish=(
            _rule(changes["request_to_publish"], True)
            if "request_to_publish" in changes
            else None
        ),
        event_linking=None if linking is None else EventLinking(linking),
        subtopics=None if subtopics is None else tuple(dict(subtopics).items()),
        retention=_retention(changes.get("retention")),
        keep_all="retention" in changes and changes["retention"] is None,
    )


def _retention(value: Retention | Mapping[str, int | bool] | None) -> Retention | None:
    """A policy from a :class:`Retention` or a map of its fields (``max_age`` in seconds,
    ``max_events``, ``compact``); ``ValueError`` for anything else."""
    if value is None or isinstance(value, Retention):
        return value
    if not isinstance(value, Mapping):
        raise ValueError("retention takes max_age, max_events and/or compact")
    unknown = set(value) - {"max_age", "max_events", "compact"}
    if unknown:
        raise ValueError(f"unknown retention settings: {sorted(unknown)}")
    max_age, max_events = value.get("max_age"), value.get("max_events")
    if isinstance(max_age, bool) or isinstance(max_events, bool):
        raise ValueError("retention max_age and max_events are integers")
    compact = value.get("compact", False)
    if not isinstance(compact, bool):
        raise ValueError("retention compact is true or false")
    return Retention(max_age, max_events, compact)


def _peers(value: Iterable[PeerId | str] | None) -> list[PeerId] | None:
    if value is None:
        return None
    return [PeerId.parse(p) for p in value]


def _rule_arg(
    value: Iterable[PeerId | str] | bool | None,
) -> tuple[PeerId, ...] | bool | None:
    if value is None or isinstance(value, bool):
        return value
    return tuple(PeerId.parse(p) for p in value)


def _rule(
    value: PublishRule | Iterable[PeerId | str] | bool | None, request: bool
) -> PublishRule:
    """A rule from what ``update_topic`` accepts: a rule, a list of peers (enabled, these),
    None (disabled: anyone may publish; nobody may request), or for
    ``request_to_publish`` a bool (enabled for anyone / disabled)."""
    if value is None:
        return PublishRule()
    if isinstance(value, PublishRule):
        return value
    if isinstance(value, bool):
        if not request:
            raise TypeError("allowed_publishers takes peers or a PublishRule, not a bool")
        return PublishRule(value, ())
    return PublishRule(True, tuple(PeerId.parse(p) for p in value))
