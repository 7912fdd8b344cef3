"""Packing a step's control messages per neighbour into BATCH messages (see
:mod:`pulsar.proto.batch.messages` for why)."""

from __future__ import annotations

from dag import PeerId
from pulsar.proto import events as ev
from pulsar.proto.gossip.messages import Graft, IHave, Prune, Shuffle
from pulsar.proto.repair.messages import Heads, HeadsDigest

from .messages import BATCH_BYTES, MAX_BATCH, Batch, BatchItem

__all__ = ["coalesce"]

_BATCHABLE: frozenset[type] = frozenset({Heads, HeadsDigest, IHave, Shuffle, Prune, Graft})
"""Exact types: JOINED is shaped like HEADS but acknowledges an edge, and goes alone."""


def _estimate(message: BatchItem) -> int:
    """A generous estimate of the encoded size (CIDs are ~38 bytes, peer ids ~40)."""
    match message:
        case Heads():
            return 64 + 40 * len(message.heads)
        case HeadsDigest():
            return 80
        case IHave():
            return 64 + 44 * len(message.entries)
        case Shuffle():
            return 64 + 42 * len(message.peers)
        case Prune() | Graft():
            return 100


def coalesce(out: list[ev.OutEvent]) -> list[ev.OutEvent]:
    """Pack the batchable messages ``out`` sends to one peer into BATCHes (a peer with a
    single such message gets it as it is). Each BATCH takes the place of the last message
    it holds, so nothing is moved ahead of what was emitted before it."""
    by_peer: dict[PeerId, list[int]] = {}
    for index, item in enumerate(out):
        if type(item) is ev.Send and type(item.message) in _BATCHABLE:
            by_peer.setdefault(item.peer, []).append(index)
    if all(len(indices) < 2 for indices in by_peer.values()):
        return out
    replace: dict[int, ev.OutEvent | None] = {}
    for peer, indices in by_peer.items():
        if len(indices) < 2:
            continue
        groups: list[list[int]] = [[]]
        size = 0
        for index in indices:
            send = out[index]
            assert isinstance(send, ev.Send)
            cost = _estimate(send.message)  # type: ignore[arg-type]
            if groups[-1] and (len(groups[-1]) >= MAX_BATCH or size + cost > BATCH_BYTES):
                groups.append([])
                size = 0
            groups[-1].append(index)
            size += cost
        for group in groups:
            for index in group[:-1]:
                replace[index] = None
            if len(group) > 1:
                items = tuple(out[i].message for i in group)  # type: ignore[union-attr]
                replace[group[-1]] = ev.Send(peer, Batch(items))  # type: ignore[arg-type]
    result: list[ev.OutEvent] = []
    for index, item in enumerate(out):
        if index in replace:
            packed = replace[index]
            if packed is not None:
                result.append(packed)
        else:
            result.append(item)
    return result
