"""History walks over event DAGs."""

from __future__ import annotations

import random

from dag import CID, EventDescriptor, Identity, cid_of
from dag.history import ancestors, causal_order, heads, missing_parents

ME = Identity.from_seed(b"h" * 32)
TOPIC = cid_of(b"\xa0")


def _chain(
    n: int, parent: CID | None = None, start: float = 1_700_000_000.0
) -> list[EventDescriptor]:
    out = []
    for i in range(n):
        event = EventDescriptor.create(ME, TOPIC, f"e{i}".encode(), parent=parent, now=start + i)
        out.append(event)
        parent = event.cid
    return out


def test_ancestors_walk_until_missing() -> None:
    chain = _chain(6)
    store = {e.cid: e for e in chain[2:]}
    found, missing = ancestors(chain[-1].cid, store.get)
    assert [e.cid for e in found] == [e.cid for e in reversed(chain[2:5])]
    assert missing == chain[1].cid
    limited, missing = ancestors(chain[-1].cid, store.get, limit=2)
    assert len(limited) == 2 and missing is None
    full = {e.cid: e for e in chain}
    found, missing = ancestors(chain[-1].cid, full.get, include_start=True)
    assert len(found) == 6 and missing is None


def test_causal_order_is_topological_and_deterministic() -> None:
    trunk = _chain(5)
    branch_a = _chain(3, parent=trunk[2].cid, start=1_700_000_100.0)
    branch_b = _chain(3, parent=trunk[2].cid, start=1_700_000_050.0)
    everything = trunk + branch_a + branch_b
    expected = causal_order(everything)
    for _ in range(20):
        shuffled = everything[:]
        random.shuffle(shuffled)
        assert causal_order(shuffled + shuffled[:3]) == expected
    position = {e.cid: i for i, e in enumerate(expected)}
    for event in everything:
        if event.parent is not None:
            assert position[event.parent] < position[event.cid]
    assert len(expected) == len(everything)


def test_missing_parents_and_heads() -> None:
    chain = _chain(4)
    assert missing_parents(chain[2:], lambda c: False) == {chain[1].cid}
    assert missing_parents(chain[2:], lambda c: c == chain[1].cid) == set()
    fork = _chain(1, parent=chain[1].cid, start=1_800_000_000.0)
    assert heads(chain + fork) == {chain[-1].cid, fork[0].cid}
