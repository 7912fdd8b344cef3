"""One step of a range-based set reconciliation: given this node's items and a peer's
RECON, what to answer and which of the peer's items this node lacks.

The technique is Negentropy's and Waku Store Sync's (range-based set reconciliation,
A. Meyer, "Range-Based Set Reconciliation", 2023); this is our own, smaller protocol. The
**asker** (a node that found a gap too deep to walk) opens with fingerprints of its
history from its horizon on, cut into :data:`SPLIT` ranges of equal counts. Each side then
answers each range of the other's message:

- a fingerprint that matches its own over the same bounds: nothing (that range agrees);
- else, when it holds few items there (:data:`LIST_AT`), or the other holds none and it
  holds at most :data:`MAX_LIST`: the list of its items there. The asker's lists ask for a
  reply (``reply``: "what do you hold here that I do not name?"); the answerer's are final;
- else it cuts the range into :data:`SPLIT` ranges by its own items and sends their
  fingerprints.

An answerer's ``reply`` list names what it holds beyond the asker's list, or, when that is
more than :data:`MAX_LIST`, is cut into fingerprints. The asker collects, from every list it
receives, the items it does not hold: those are what it fetches (in the answerer's
delivery order, from the positions the lists carry). The exchange ends when the asker has
nothing to send: two histories that differ by ``d`` items in one range of time take about
``log_16(n / d) + 2`` round trips and bytes proportional to ``d`` plus 16 fingerprints
per round. Only the asker learns; the answerer keeps no state between messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

from dag import CID

from .items import Bound, ItemIndex
from .messages import MAX_IDS, MAX_RANGES, Fingerprint, IdList

__all__ = ["LIST_AT", "MAX_LIST", "SPLIT", "Step", "answer", "opening"]

LIST_AT = 16
"""A side holding at most this many items of a differing range lists them."""
MAX_LIST = 4096
"""The longest list sent for a range the other side holds nothing of (a node that was
away): larger ranges are cut first."""
SPLIT = 16
"""Ranges a differing range is cut into."""


@dataclass(slots=True)
class Step:
    """What one side sends next, and (for the asker) the peer's items it lacks, as
    ``(peer's position, CID)``."""

    fps: list[Fingerprint] = field(default_factory=list)
    ids: list[IdList] = field(default_factory=list)
    need: list[tuple[int, CID]] = field(default_factory=list)
    _listed: int = 0

    @property
    def empty(self) -> bool:
        return not self.fps and not self.ids


def opening(index: ItemIndex, lo: Bound, hi: Bound) -> Step:
    """The asker's first message: its items in ``[lo, hi)``, fingerprinted."""
    step = Step()
    i, j = index.span(lo, hi)
    _describe(index, lo, hi, i, j, step, reply=True, extra=SPLIT - 1)
    return step


def answer(index: ItemIndex, fps: tuple[Fingerprint, ...], ids: tuple[IdList, ...], *,
           asker: bool) -> Step:
    """This side's answer to a peer's RECON (``asker``: this side opened the session).

    Every range of the peer's message that is not settled is answered, so none is ever
    dropped: in order, each is listed or cut while the message has room
    (:data:`~.messages.MAX_RANGES`); the ranges beyond go back as one fingerprint, which
    the next rounds cut in turn. Differences scattered over more ranges than a message
    holds therefore take more rounds, not more room; a session that reaches the round
    limit ends, and the walk finds the rest."""
    step = Step()
    pending: list[tuple[Bound, Bound, int, int, bool]] = []
    for theirs in fps:
        i, j = index.span(theirs.lo, theirs.hi)
        if j - i == theirs.count and index.fingerprint(i, j) == theirs.fp:
            continue
        if not asker and (j - i <= LIST_AT or (theirs.count == 0 and j - i <= MAX_LIST)) \
                and _fits(step, j - i):
            _list(index, theirs.lo, theirs.hi, i, j, step, reply=False)
        else:
            pending.append((theirs.lo, theirs.hi, i, j, True))
    for listed in ids:
        named = {cid.raw for cid, _ in listed.items}
        if asker:
            step.need += [(pos, cid) for cid, pos in listed.items if not index.has(cid.raw)]
        if not listed.reply:
            continue
        i, j = index.span(listed.lo, listed.hi)
        extra = [(raw, pos) for raw, pos in index.items(i, j) if raw not in named]
        if not extra:
            continue
        if len(extra) <= MAX_LIST and _fits(step, len(extra)):
            step.ids.append(IdList(listed.lo, listed.hi, False,
                                   tuple((CID(raw), pos) for raw, pos in extra)))
            step._listed += len(extra)
        else:
            pending.append((listed.lo, listed.hi, i, j, False))
    pending.sort(key=lambda entry: entry[0])
    room = MAX_RANGES - len(step.ids)
    for lo, hi, i, j, describe in pending:
        if room < SPLIT + 1:  # no room to cut them all: the rest go back as one range
            last = pending[-1][1]
            p, q = index.span(lo, last)
            step.fps.append(Fingerprint(lo, last, q - p, index.fingerprint(p, q)))
            break
        before = len(step.fps) + len(step.ids)
        if describe:
            _describe(index, lo, hi, i, j, step, reply=asker, extra=SPLIT - 1)
        else:
            _split(index, lo, hi, i, j, step, SPLIT)
        room -= len(step.fps) + len(step.ids) - before
    return step


def _fits(step: Step, items: int) -> bool:
    return step._listed + items <= MAX_IDS


def _describe(index: ItemIndex, lo: Bound, hi: Bound, i: int, j: int, step: Step, *,
              reply: bool, extra: int) -> None:
    """A range that differs (or opens the session), told from this side: a list when it
    is short, else fingerprints of up to ``1 + extra`` parts."""
    if j - i <= LIST_AT and _fits(step, j - i):
        _list(index, lo, hi, i, j, step, reply=reply)
    else:
        _split(index, lo, hi, i, j, step, 1 + extra)


def _list(index: ItemIndex, lo: Bound, hi: Bound, i: int, j: int, step: Step, *,
          reply: bool) -> None:
    items = tuple((CID(raw), pos) for raw, pos in index.items(i, j))
    step.ids.append(IdList(lo, hi, reply, items))
    step._listed += j - i


def _split(index: ItemIndex, lo: Bound, hi: Bound, i: int, j: int, step: Step,
           parts: int) -> None:
    """``[lo, hi)`` cut at this side's items into up to ``parts`` parts of equal counts
    (one: the range's fingerprint alone, for the other side to cut)."""
    parts = max(1, min(parts, j - i))
    bounds = [lo]
    for k in range(1, parts):
        cut = index.key(i + k * (j - i) // parts)
        if cut > bounds[-1]:
            bounds.append(cut)
    bounds.append(hi)
    for a, b in pairwise(bounds):
        p, q = index.span(a, b)
        step.fps.append(Fingerprint(a, b, q - p, index.fingerprint(p, q)))
