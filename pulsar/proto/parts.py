"""What :class:`~pulsar.proto.publishing.Publishing` shares with the rest of the core.

Publishing (publish rules, linking, the write quorum, heads records, learning before
publishing) is still one class with :class:`~pulsar.proto.core.PulsarCore`: this base
names the state they share and the few methods one calls in the other, so that each
module type-checks on its own. The other layers — trees, versions (adoption and topic
commands), repair, gossip, membership, fragments — are objects the core holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from dag import CID, EventDescriptor, Identity, PeerId
from pulsar.proto.fragments.layer import Fragments
from pulsar.proto.gossip.plumtree import Plumtree
from pulsar.proto.repair.backfill import Backfill, Unvouched
from pulsar.proto.tree.messages import Event
from pulsar.proto.tree.routing import Tree, TreeRouter
from pulsar.proto.versions.adoption import Adoption, AdoptionOut
from pulsar.proto.versions.lineage import TopicVersions

from . import events as ev
from .config import CoreConfig
from .events import Out
from .stores import OwnStores

__all__ = ["CoreParts"]


class CoreParts(ABC):
    identity: Identity
    me: PeerId
    config: CoreConfig
    router: TreeRouter
    _trees: dict[CID, Tree]
    _lookup: Callable[[CID], bytes | None]
    versions: TopicVersions
    adoption: Adoption
    lazy: Plumtree
    backfill: Backfill
    frags: Fragments
    metrics: dict[str, int]
    _stores: OwnStores
    _parent_checks: dict[CID, list[tuple[ev.Publish, CID]]]
    _syncing: set[CID]
    _version_waiters: dict[CID, set[CID]]
    """Topic version -> the trees whose publishing waits for it (an index, so adopting a
    version costs the trees that wait, not every tree the node knows)."""

    # -- core.py
    @abstractmethod
    def _on_subscribe(self, cmd: ev.Subscribe, now: float) -> Out: ...

    @abstractmethod
    def _on_event(self, peer: PeerId | None, msg: Event, now: float) -> Out: ...

    @abstractmethod
    def _verify_backfilled(
        self, topic: CID, block: bytes
    ) -> EventDescriptor | Unvouched | None: ...

    @abstractmethod
    def _parent_for(self, tree: Tree) -> CID | None: ...

    @abstractmethod
    def _eager(self, tree: Tree) -> list[PeerId]: ...

    @abstractmethod
    def _cover(self, tree: Tree, cid: CID, eager: list[PeerId],
               sender: PeerId | None) -> None: ...

    @abstractmethod
    def _remember(self, tree: Tree, cid: CID) -> None: ...

    @abstractmethod
    def _reject(self, peer: PeerId | None, reason: str) -> Out: ...

    # -- publishing.py
    @abstractmethod
    def _publish(self, tree: Tree, event: EventDescriptor, request: int | None, *,
                 then: ev.TopicReady | None = None) -> Out: ...

    @abstractmethod
    def _maybe_synced(self, tree: Tree, now: float) -> Out: ...

    @abstractmethod
    def _learn_record_heads(self, tree: Tree, now: float) -> Out: ...

    @abstractmethod
    def _arm_record(self, tree: Tree, delay: float, now: float) -> Out: ...

    @abstractmethod
    def _large_blocks(self, event: EventDescriptor) -> list[tuple[CID, bytes]] | None: ...

    @abstractmethod
    def _adopt(self, items: AdoptionOut, now: float) -> Out: ...
