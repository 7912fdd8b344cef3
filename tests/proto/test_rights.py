"""Topic versions and publishing rights in the core: exact inputs, asserted outputs.

The rule under test (docs/protocol.md, "Publishing rights and revocation"): every event is
judged by the latest version the receiver knows; an event only an older version allows is
valid only if the newer version's recorded heads vouch for it (it is one of them or an
ancestor of one); only the author publishes on the meta topic.
"""

from __future__ import annotations

from typing import Any

from dag import CID, EventDescriptor, Identity, PeerId, PublishRule, TopicDescriptor
from dag.records import HeadsRecord
from pulsar.proto import events as ev
from pulsar.proto.core import PulsarCore
from pulsar.proto.repair.messages import Blocks, Heads, Joined, Want
from pulsar.proto.tree.messages import Event
from pulsar.proto.versions.lineage import TopicVersions


class NoRouting:
    def closest_peers(self, key: bytes, count: int) -> list[PeerId]:
        return []


def _ident(i: int) -> Identity:
    return Identity.from_seed(bytes([i]) * 32)


AUTHOR, BOB, CAROL, READER = _ident(1), _ident(2), _ident(3), _ident(4)


def _topic(**kw: Any) -> tuple[TopicDescriptor, TopicDescriptor]:
    meta = TopicDescriptor.create(AUTHOR, "t/meta", allowed_publishers=PublishRule(True, ()))
    topic = TopicDescriptor.create(AUTHOR, "t", meta=meta.cid, now=1000.0, **kw)
    return meta, topic


def _version(parent: TopicDescriptor, heads: list[CID], **kw: Any) -> TopicDescriptor:
    return TopicDescriptor.create(
        AUTHOR, "t", meta=parent.meta, parent=parent.cid, heads=heads, now=2000.0, **kw
    )


def _reader(meta: TopicDescriptor, topic: TopicDescriptor, *versions: TopicDescriptor,
            store: dict[CID, bytes] | None = None) -> PulsarCore:
    blocks = store if store is not None else {}
    blocks[meta.cid] = meta.block
    core = PulsarCore(READER, NoRouting(), lookup=blocks.get)
    core.handle(ev.Subscribe(topic, True, 0.0, versions=versions), 3000.0)
    return core


def _event(who: Identity, version: TopicDescriptor, payload: bytes, parent: CID | None = None,
           now: float = 1500.0) -> EventDescriptor:
    return EventDescriptor.create(who, version.cid, payload, parent=parent, now=now)


def _receive(core: PulsarCore, topic: TopicDescriptor, event: EventDescriptor,
             now: float = 3001.0) -> list[Any]:
    return core.handle(ev.Received(AUTHOR.peer_id, Event(topic.cid, event.block, 1)), now)


def _delivered(out: list[Any]) -> list[CID]:
    return [o.event.cid for o in out if isinstance(o, ev.Deliver)]


def _rejected(out: list[Any]) -> list[str]:
    return [o.reason for o in out if isinstance(o, ev.Rejected)]


def test_revoked_publisher_cannot_publish_under_the_version_that_allowed_it() -> None:
    """v1 allows Bob; v2 (recording the heads then) does not. Bob, knowing only v1,
    publishes under v1 — and back-dates it before v2 — a reader that knows v2 refuses."""
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    before = _event(BOB, v1, b"allowed then")
    v2 = _version(v1, [before.cid], allowed_publishers=[CAROL.peer_id])
    core = _reader(meta, v1, v2)
    assert core.latest(v1.cid) == v2
    late = _event(BOB, v1, b"after revocation", parent=before.cid, now=1600.0)
    out = _receive(core, v1, late)
    assert _delivered(out) == [] and "may no longer publish" in _rejected(out)[0]
    backdated = _event(BOB, v1, b"back-dated", now=1.0)
    assert _delivered(_receive(core, v1, backdated)) == []
    # What v2 vouches for is still history: delivered, and its ancestors with it.
    assert _delivered(_receive(core, v1, before)) == [before.cid]


def test_history_before_a_revocation_is_admitted_walking_back_from_the_recorded_heads() -> None:
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    e0 = _event(BOB, v1, b"0", now=1100.0)
    e1 = _event(BOB, v1, b"1", parent=e0.cid, now=1200.0)
    v2 = _version(v1, [e1.cid], allowed_publishers=[])
    core = _reader(meta, v1, v2)
    out = _receive(core, v1, e1)
    # e1 is vouched for; its parent is missing and becomes vouched for too (a gap opens).
    assert _rejected(out) == []
    out = _receive(core, v1, e0)
    assert _rejected(out) == [] and _delivered(out) == [e0.cid, e1.cid]
    # A sibling of e0 by Bob that no recorded head descends from is refused.
    sibling = _event(BOB, v1, b"fork", now=1150.0)
    assert _rejected(_receive(core, v1, sibling))


def test_a_publisher_still_allowed_is_judged_by_the_latest_version_whatever_it_names() -> None:
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id, CAROL.peer_id])
    v2 = _version(v1, [], allowed_publishers=[CAROL.peer_id])
    core = _reader(meta, v1, v2)
    in_flight = _event(CAROL, v1, b"published before Carol heard of v2")
    assert _delivered(_receive(core, v1, in_flight)) == [in_flight.cid]


def test_only_the_author_publishes_on_the_meta_topic() -> None:
    meta, v1 = _topic()
    core = _reader(meta, v1)
    spam = EventDescriptor.create(BOB, meta.cid, b"bafy-nonsense")
    out = core.handle(ev.Received(BOB.peer_id, Event(meta.cid, spam.block, 1)), 3001.0)
    assert _delivered(out) == [] and "only the author" in _rejected(out)[0]
    assert not any(isinstance(o, ev.Fetch) for o in out)  # no fetch amplification


def test_a_version_announced_on_the_meta_topic_is_fetched_and_adopted() -> None:
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    store: dict[CID, bytes] = {}
    core = _reader(meta, v1, store=store)
    v2 = _version(v1, [], allowed_publishers=[])
    announcement = EventDescriptor.create(AUTHOR, meta.cid, v2.cid.raw, now=2500.0)
    out = core.handle(
        ev.Received(AUTHOR.peer_id, Event(meta.cid, announcement.block, 1)), 3001.0
    )
    assert _delivered(out) == [announcement.cid] and ev.Fetch(v2.cid) in out
    out = core.handle(ev.BlockFetched(v2.cid, v2.block), 3002.0)
    assert ev.VersionAdopted(v1.cid, v2) in out
    assert core.latest(v1.cid) == v2
    assert _rejected(_receive(core, v1, _event(BOB, v1, b"too late"), 3003.0))


def test_a_version_by_another_author_is_never_adopted() -> None:
    meta, v1 = _topic()
    core = _reader(meta, v1)
    forged = TopicDescriptor.create(BOB, "t", meta=meta.cid, parent=v1.cid)
    core.handle(ev.Subscribe(v1, True, versions=(forged,)), 3000.0)
    assert core.latest(v1.cid) == v1


def test_update_records_the_heads_stores_then_announces_on_the_meta_topic() -> None:
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    author = PulsarCore(AUTHOR, NoRouting())
    author.handle(ev.Subscribe(meta, True, 0.0), 10.0)
    author.handle(ev.Subscribe(v1, True, 0.0), 10.0)
    (stored,) = author.handle(ev.Publish(v1.cid, b"x", None, 1), 11.0)
    assert isinstance(stored, ev.StoreDht)
    author.handle(ev.DhtStored(stored.cid, 2), 11.1)
    out = author.handle(ev.UpdateTopic(2, v1.cid, ev.TopicChanges(
        allowed_publishers=PublishRule(True, ()))), 12.0)
    # A change of rights first reads the publishers' heads records (none found here).
    assert out == [ev.FetchRecords(v1.cid, (AUTHOR.peer_id, BOB.peer_id), 2)]
    out = author.handle(ev.RecordsFetched(v1.cid, (), 2), 12.05)
    assert [type(o) for o in out] == [ev.StoreDht]
    v2 = TopicDescriptor.from_block(out[0].block)
    assert v2.parent == v1.cid and v2.heads == (stored.cid,)
    assert author.latest(v1.cid) == v1  # not before it is persisted
    out = author.handle(ev.DhtStored(v2.cid, 3), 12.1)
    assert ev.VersionAdopted(v1.cid, v2) in out and author.latest(v1.cid) == v2
    (announce,) = [o for o in out if isinstance(o, ev.StoreDht)]
    assert EventDescriptor.from_block(announce.block).payload == v2.cid.raw
    out = author.handle(ev.DhtStored(announce.cid, 3), 12.2)
    assert ev.TopicReady(2, v2) in out


def test_a_version_never_records_an_event_of_ours_still_being_stored() -> None:
    """CI, verify seed 11: the author revoked a publisher while its own event was still
    on its way into the DHT. The new version named that event as a head; the store then
    missed its quorum and the publish was told "not persisted", yet every node that
    adopted the version fetched the event from the replicas that had it and delivered it.
    A version records only the newest event of ours that is persisted."""
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    author = PulsarCore(AUTHOR, NoRouting())
    author.handle(ev.Subscribe(meta, True, 0.0), 10.0)
    author.handle(ev.Subscribe(v1, True, 0.0), 10.0)
    (first,) = author.handle(ev.Publish(v1.cid, b"persisted", None, 1), 11.0)
    assert isinstance(first, ev.StoreDht)
    author.handle(ev.DhtStored(first.cid, 2), 11.1)
    (pending,) = author.handle(ev.Publish(v1.cid, b"still being stored", None, 2), 11.2)
    assert isinstance(pending, ev.StoreDht)
    assert EventDescriptor.from_block(pending.block).parent == first.cid
    author.handle(ev.UpdateTopic(3, v1.cid, ev.TopicChanges(
        allowed_publishers=PublishRule(True, ()))), 12.0)
    out = author.handle(ev.RecordsFetched(v1.cid, (), 3), 12.05)
    (store,) = [o for o in out if isinstance(o, ev.StoreDht)]
    v2 = TopicDescriptor.from_block(store.block)
    assert v2.heads == (first.cid,)
    out = author.handle(ev.DhtStored(pending.cid, 0), 12.1)
    assert [o.kind for o in out if isinstance(o, ev.CommandFailed)] == ["unpersisted"]


def test_a_revocation_records_what_the_revoked_publisher_was_acknowledged_for() -> None:
    """Issue #28 (verify, 25 nodes, seed 2): Bob's last events were acknowledged — named by
    his heads record at quorum — but had not reached the author when the author revoked
    him; the new version did not record them, so every node that learned of them later
    refused them, and with them the allowed events behind them. The author now reads the
    publishers' records before it writes the version, and records their heads."""
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    author = PulsarCore(AUTHOR, NoRouting())
    author.handle(ev.Subscribe(meta, True, 0.0), 10.0)
    author.handle(ev.Subscribe(v1, True, 0.0), 10.0)
    bobs = _event(BOB, v1, b"acknowledged, never seen by the author", now=11.0)
    record = HeadsRecord.create(BOB, v1.cid, 1, v1.cid, [bobs.cid], now=11.5)
    out = author.handle(ev.UpdateTopic(2, v1.cid, ev.TopicChanges(
        allowed_publishers=PublishRule(True, ()))), 12.0)
    assert out == [ev.FetchRecords(v1.cid, (AUTHOR.peer_id, BOB.peer_id), 2)]
    # The core's own syncs (request 0) do not answer the update.
    assert not [o for o in author.handle(ev.RecordsFetched(v1.cid, (record,)), 12.01)
                if isinstance(o, ev.StoreDht)]
    out = author.handle(ev.RecordsFetched(v1.cid, (record,), 2), 12.05)
    (store,) = [o for o in out if isinstance(o, ev.StoreDht)]
    v2 = TopicDescriptor.from_block(store.block)
    assert bobs.cid in v2.heads
    # A reader that knows v2 accepts Bob's acknowledged event, and still refuses a new one.
    reader = _reader(meta, v1, v2)
    assert not _rejected(_receive(reader, v1, bobs, 3001.0))
    assert _rejected(_receive(reader, v1, _event(BOB, v1, b"after", now=13.0), 3002.0))


def test_only_the_author_may_update() -> None:
    meta, v1 = _topic()
    core = _reader(meta, v1)
    out = core.handle(ev.UpdateTopic(9, v1.cid), 3001.0)
    assert out == [ev.CommandFailed(9, "only the topic's author may update it")]


def test_a_version_announced_before_the_node_subscribed_is_adopted_from_meta_history() -> None:
    """Members follow the meta topic's whole history, so a version made while a node was
    away (or before it subscribed) is adopted when a neighbour names the meta heads."""
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    v2 = _version(v1, [], allowed_publishers=[])
    announcement = EventDescriptor.create(AUTHOR, meta.cid, v2.cid.raw, now=1.0)
    core = _reader(meta, v1)
    out = core.handle(ev.Received(AUTHOR.peer_id, Heads(meta.cid, (announcement.cid,))), 3001.0)
    (want,) = [o.message for o in out if isinstance(o, ev.Send) and isinstance(o.message, Want)]
    assert want.head == announcement.cid and want.after == "1970-01-01T00:00:00.000Z"  # all
    out = core.handle(
        ev.Received(AUTHOR.peer_id, Blocks(meta.cid, announcement.cid, (announcement.block,))),
        3001.1,
    )
    assert _delivered(out) == [announcement.cid] and ev.Fetch(v2.cid) in out
    core.handle(ev.BlockFetched(v2.cid, v2.block), 3001.2)
    assert core.latest(v1.cid) == v2


def test_a_replay_subscriber_walks_back_only_once_it_knows_the_versions_the_records_name(
) -> None:
    """Issue #28: the records name the renamed version (the author's) and the first one
    (Bob's, revoked since). Backfilled at once, the author's newest event — naming a
    version still being fetched — was refused for good, and its ancestors never fetched;
    and Bob's older event, reached once the versions were known, was refused as not
    vouched for (its child had been admitted before the version vouching for it)."""
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    b1 = _event(BOB, v1, b"b1", now=1100.0)
    b2 = _event(BOB, v1, b"b2", parent=b1.cid, now=1200.0)
    v2 = _version(v1, [b2.cid], allowed_publishers=[])
    a1 = _event(AUTHOR, v2, b"a1", parent=b2.cid, now=2100.0)
    a2 = _event(AUTHOR, v2, b"a2", parent=a1.cid, now=2200.0)
    v3 = TopicDescriptor.create(AUTHOR, "t, renamed", meta=meta.cid, parent=v2.cid,
                                heads=[a2.cid], allowed_publishers=[], now=2300.0)
    core = _reader(meta, v1)
    records = (
        HeadsRecord.create(AUTHOR, v1.cid, 2, v3.cid, (a2.cid,), (BOB.peer_id,), now=2300.0),
        HeadsRecord.create(BOB, v1.cid, 1, v1.cid, (b2.cid,), now=1200.0),
    )
    out = core.handle(ev.RecordsFetched(v1.cid, records), 3000.1)
    fetches = [o.cid for o in out if isinstance(o, ev.Fetch)]
    assert fetches == [v3.cid]  # the version first: no event is fetched yet
    out = core.handle(ev.BlockFetched(v3.cid, v3.block), 3000.2)
    assert [o.cid for o in out if isinstance(o, ev.Fetch)] == [v2.cid]
    out = core.handle(ev.BlockFetched(v2.cid, v2.block), 3000.3)
    assert core.latest(v1.cid) == v3
    assert {o.cid for o in out if isinstance(o, ev.Fetch)} == {a2.cid, b2.cid}
    delivered: list[CID] = []
    for event in (b2, a2, b1, a1):  # the DHT answers in any order
        out = core.handle(ev.BlockFetched(event.cid, event.block), 3000.4)
        assert _rejected(out) == []
        delivered += _delivered(out)
    assert delivered == [b1.cid, b2.cid, a1.cid, a2.cid]


def test_a_backfilled_event_naming_a_version_not_known_yet_waits_for_it() -> None:
    """A neighbour names a head published under a version this node has not fetched yet
    (the meta topic's announcement is still on its way): the event waits for the version
    instead of being refused for good, and so do the blocks the DHT returns."""
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    v2 = _version(v1, [], allowed_publishers=[])
    e1 = _event(AUTHOR, v2, b"1", now=2100.0)
    e2 = _event(AUTHOR, v2, b"2", parent=e1.cid, now=2200.0)
    core = _reader(meta, v1)
    out = core.handle(ev.Received(CAROL.peer_id, Heads(v1.cid, (e2.cid,))), 3001.0)
    (want,) = [o.message for o in out if isinstance(o, ev.Send) and isinstance(o.message, Want)]
    assert want.head == e2.cid
    out = core.handle(ev.Received(CAROL.peer_id, Blocks(v1.cid, e2.cid, (e2.block,))), 3001.1)
    assert _rejected(out) == [] and ev.Fetch(v2.cid) in out
    out = core.handle(ev.BlockFetched(v2.cid, v2.block), 3001.2)
    assert _rejected(out) == [] and core.latest(v1.cid) == v2
    (want,) = [o.message for o in out if isinstance(o, ev.Send) and isinstance(o.message, Want)]
    assert want.head == e1.cid  # the walk goes on
    out = core.handle(ev.Received(CAROL.peer_id, Blocks(v1.cid, e1.cid, (e1.block,))), 3001.3)
    assert _delivered(out) == [e1.cid, e2.cid]


def test_a_backfilled_event_naming_a_version_nobody_has_is_refused() -> None:
    meta, v1 = _topic()
    nowhere = _version(v1, [])
    event = _event(AUTHOR, nowhere, b"under a version that is nowhere", now=2100.0)
    core = _reader(meta, v1)
    # Nobody asked for it: nothing is fetched (a peer cannot make us fetch what it likes).
    unasked = core.handle(
        ev.Received(CAROL.peer_id, Blocks(v1.cid, event.cid, (event.block,))), 3000.5
    )
    assert not any(isinstance(o, ev.Fetch) for o in unasked)
    core.handle(ev.Received(CAROL.peer_id, Heads(v1.cid, (event.cid,))), 3001.0)
    out = core.handle(
        ev.Received(CAROL.peer_id, Blocks(v1.cid, event.cid, (event.block,))), 3001.1
    )
    assert ev.Fetch(nowhere.cid) in out and _rejected(out) == []
    out = core.handle(ev.BlockFetched(nowhere.cid, None), 3001.2)
    assert _delivered(out) == [] and any("not a valid event" in r for r in _rejected(out))


def test_a_head_from_the_dht_naming_a_version_not_found_yet_waits_for_it() -> None:
    """The version a record names was not found at first (the walk then starts without
    it): the event fetched from the DHT that names it waits while it is fetched again."""
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    v2 = _version(v1, [], allowed_publishers=[])
    e1 = _event(AUTHOR, v2, b"1", now=2100.0)
    e2 = _event(AUTHOR, v2, b"2", parent=e1.cid, now=2200.0)
    core = _reader(meta, v1)
    record = HeadsRecord.create(AUTHOR, v1.cid, 1, v2.cid, (e2.cid,), now=2200.0)
    out = core.handle(ev.RecordsFetched(v1.cid, (record,)), 3000.1)
    assert [o.cid for o in out if isinstance(o, ev.Fetch)] == [v2.cid]
    out = core.handle(ev.BlockFetched(v2.cid, None), 3000.2)
    assert [o.cid for o in out if isinstance(o, ev.Fetch)] == [e2.cid]
    out = core.handle(ev.BlockFetched(e2.cid, e2.block), 3000.3)
    assert _rejected(out) == [] and [o.cid for o in out if isinstance(o, ev.Fetch)] == [v2.cid]
    out = core.handle(ev.BlockFetched(v2.cid, v2.block), 3000.4)
    assert _rejected(out) == [] and [o.cid for o in out if isinstance(o, ev.Fetch)] == [e1.cid]
    out = core.handle(ev.BlockFetched(e1.cid, e1.block), 3000.5)
    assert _delivered(out) == [e1.cid, e2.cid]


class _OnePeer:
    def __init__(self, peer: PeerId) -> None:
        self.peer = peer

    def closest_peers(self, key: bytes, count: int) -> list[PeerId]:
        return [self.peer]


def test_a_publish_waiting_for_a_version_that_is_not_found_is_made_with_the_clock() -> None:
    """The version a record names is not found: the publish that waited for it goes on,
    created now (it was created at the epoch: the wait ended with time 0)."""
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    missing = _version(v1, [], allowed_publishers=[BOB.peer_id])
    bob = PulsarCore(BOB, _OnePeer(AUTHOR.peer_id), lookup={meta.cid: meta.block}.get)
    bob.handle(ev.Subscribe(v1, False), 2000.0)
    bob.handle(ev.Received(AUTHOR.peer_id, Joined(v1.cid, ())), 2000.1)
    (fetch,) = bob.handle(ev.Publish(v1.cid, b"hello", None, 1), 2000.2)
    assert isinstance(fetch, ev.FetchRecords)
    record = HeadsRecord.create(AUTHOR, v1.cid, 1, missing.cid, (), now=1700.0)
    assert ev.Fetch(missing.cid) in bob.handle(ev.RecordsFetched(v1.cid, (record,)), 2000.3)
    out = bob.handle(ev.BlockFetched(missing.cid, None), 2000.4)
    (store,) = [o for o in out if isinstance(o, ev.StoreDht)]
    assert abs(EventDescriptor.from_block(store.block).created_at - 2000.4) < 0.001


def test_needs_vouching_names_exactly_the_refusals_a_recorded_history_could_lift() -> None:
    """Replay judges such events again once the whole walk is known; nothing else."""

    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    v2 = TopicDescriptor.create(AUTHOR, "t", meta=meta.cid, parent=v1.cid,
                                allowed_publishers=[], now=20.0)
    versions = TopicVersions()
    versions.add(v1)
    versions.add(v2)
    bob_before = EventDescriptor.create(BOB, v1.cid, b"before the revocation", now=15.0)
    bob_after = EventDescriptor.create(BOB, v2.cid, b"after it", now=25.0)
    author = EventDescriptor.create(AUTHOR, v2.cid, b"allowed", now=25.0)
    assert versions.admit(v1.cid, bob_before) is not None
    assert versions.needs_vouching(v1.cid, bob_before)
    assert not versions.needs_vouching(v1.cid, bob_after)  # refused for good
    assert not versions.needs_vouching(v1.cid, author)  # not refused at all
    versions.vouch(v1.cid, bob_before.cid)
    assert not versions.needs_vouching(v1.cid, bob_before)
    assert versions.admit(v1.cid, bob_before) is None


def _run_store(out: list[Any], blocks: dict[CID, bytes]) -> None:
    """Apply the core's ``StoreLocal`` outputs to the lookup's dictionary, as a driver does."""
    for o in out:
        if isinstance(o, ev.StoreLocal):
            blocks[o.cid] = o.block


def test_an_event_reached_first_from_an_unvouched_child_waits_for_the_recorded_head() -> None:
    """Bob published x1 then x2; v2 revokes Bob and records x2. Carol, who never saw x2,
    published z on x1 afterwards. A reader meets z first: walking back from it reaches x1,
    which nothing vouches for yet, since the walk from x2 has not passed it. x1 is not
    refused for good: z stays held, and once x2 arrives (vouched, so x1 is vouched too)
    x1 is judged again and everything is delivered, parents first."""
    from pulsar.proto.timers import RetryFetch

    meta, v1 = _topic(allowed_publishers=[BOB.peer_id, CAROL.peer_id])
    x1 = _event(BOB, v1, b"x1", now=1100.0)
    x2 = _event(BOB, v1, b"x2", parent=x1.cid, now=1200.0)
    v2 = _version(v1, [x2.cid], allowed_publishers=[CAROL.peer_id])
    z = _event(CAROL, v2, b"z", parent=x1.cid, now=2100.0)
    blocks: dict[CID, bytes] = {}
    core = _reader(meta, v1, v2, store=blocks)
    out = _receive(core, v1, z)
    _run_store(out, blocks)
    (want,) = [o.message for o in out if isinstance(o, ev.Send) and isinstance(o.message, Want)]
    assert want.head == x1.cid
    out = core.handle(ev.Received(AUTHOR.peer_id, Blocks(v1.cid, x1.cid, (x1.block,))), 3001.1)
    _run_store(out, blocks)
    assert _rejected(out) == [] and _delivered(out) == []
    (retry,) = [o for o in out if isinstance(o, ev.SetTimer) and isinstance(o.timer, RetryFetch)]
    out = _receive(core, v1, x2, now=3001.2)
    _run_store(out, blocks)
    assert _rejected(out) == [] and _delivered(out) == []  # x2 waits for x1 too
    out = core.handle(ev.TimerFired(retry.timer), 3001.2 + retry.delay)
    assert _rejected(out) == []
    delivered = _delivered(out)
    assert sorted(delivered, key=bytes) == sorted([x1.cid, x2.cid, z.cid], key=bytes)
    assert delivered[0] == x1.cid


def test_a_revocation_vouches_for_what_is_missing_below_heads_admitted_before_it() -> None:
    """x2 (Bob) reached the reader while Bob still had the right; its parent x1 did not.
    Then v2 revokes Bob, recording x2. Admitting x2 passed no vouching down (nothing was
    vouched then), so adopting v2 passes it down the held history: x1, when it comes, is
    history v2 vouches for, not a refused event."""
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    x1 = _event(BOB, v1, b"x1", now=1100.0)
    x2 = _event(BOB, v1, b"x2", parent=x1.cid, now=1200.0)
    v2 = _version(v1, [x2.cid], allowed_publishers=[])
    blocks: dict[CID, bytes] = {}
    core = _reader(meta, v1, store=blocks)
    out = _receive(core, v1, x2)
    _run_store(out, blocks)
    assert _rejected(out) == [] and _delivered(out) == []  # held: its parent is missing
    announcement = EventDescriptor.create(AUTHOR, meta.cid, v2.cid.raw, now=2500.0)
    core.handle(ev.Received(AUTHOR.peer_id, Event(meta.cid, announcement.block, 1)), 3001.1)
    core.handle(ev.BlockFetched(v2.cid, v2.block), 3001.15)
    assert core.latest(v1.cid) == v2
    out = _receive(core, v1, x1, now=3001.2)
    assert _rejected(out) == [] and _delivered(out) == [x1.cid, x2.cid]


def test_vouching_passes_through_events_admitted_on_their_own_rights() -> None:
    """Bob published x1, Carol c1 on it and h on c1; v2 revokes Bob and records h. The
    reader meets Carol's later z (on c1) first: c1 is admitted on Carol's rights, which
    vouches for nothing, and x1 waits, unvouched. When h arrives, admitting it vouches for
    c1 — already held — and the vouching must go on down to x1."""
    from pulsar.proto.timers import RetryFetch

    meta, v1 = _topic(allowed_publishers=[BOB.peer_id, CAROL.peer_id])
    x1 = _event(BOB, v1, b"x1", now=1100.0)
    c1 = _event(CAROL, v1, b"c1", parent=x1.cid, now=1200.0)
    h = _event(CAROL, v1, b"h", parent=c1.cid, now=1300.0)
    v2 = _version(v1, [h.cid], allowed_publishers=[CAROL.peer_id])
    z = _event(CAROL, v2, b"z", parent=c1.cid, now=2100.0)
    blocks: dict[CID, bytes] = {}
    core = _reader(meta, v1, v2, store=blocks)
    out = _receive(core, v1, z)
    _run_store(out, blocks)
    out = core.handle(
        ev.Received(AUTHOR.peer_id, Blocks(v1.cid, c1.cid, (c1.block, x1.block))), 3001.1)
    _run_store(out, blocks)
    assert _rejected(out) == [] and _delivered(out) == []
    (retry,) = [o for o in out if isinstance(o, ev.SetTimer) and isinstance(o.timer, RetryFetch)]
    out = _receive(core, v1, h, now=3001.2)
    _run_store(out, blocks)
    assert _rejected(out) == [] and _delivered(out) == []
    out = core.handle(ev.TimerFired(retry.timer), 3001.2 + retry.delay)
    assert _rejected(out) == []
    delivered = _delivered(out)
    assert delivered[:2] == [x1.cid, c1.cid]
    assert sorted(delivered[2:], key=bytes) == sorted([z.cid, h.cid], key=bytes)


def test_children_of_an_unvouched_event_outlast_the_gap_timeout() -> None:
    """The walk from the recorded head may take longer than a gap's timeout: while the
    frontier is refused only for want of vouching, the gap's timeout is put off (up to
    ``vouch_patience``) instead of releasing its children before their parent."""
    from pulsar.proto.timers import GapTimeout, RetryFetch

    meta, v1 = _topic(allowed_publishers=[BOB.peer_id, CAROL.peer_id])
    x1 = _event(BOB, v1, b"x1", now=1100.0)
    x2 = _event(BOB, v1, b"x2", parent=x1.cid, now=1200.0)
    v2 = _version(v1, [x2.cid], allowed_publishers=[CAROL.peer_id])
    z = _event(CAROL, v2, b"z", parent=x1.cid, now=2100.0)
    blocks: dict[CID, bytes] = {}
    core = _reader(meta, v1, v2, store=blocks)
    out = _receive(core, v1, z)
    _run_store(out, blocks)
    (gap_timer,) = [o for o in out if isinstance(o, ev.SetTimer)
                    and isinstance(o.timer, GapTimeout)]
    out = core.handle(ev.Received(AUTHOR.peer_id, Blocks(v1.cid, x1.cid, (x1.block,))), 3001.1)
    _run_store(out, blocks)
    # The plain gap timeout comes: nothing is released, the deadline moves on.
    now = 3001.0 + gap_timer.delay
    out = core.handle(ev.TimerFired(gap_timer.timer), now)
    assert _delivered(out) == [] and not any(isinstance(o, ev.GapReported) for o in out)
    assert any(isinstance(o, ev.SetTimer) and isinstance(o.timer, GapTimeout) for o in out)
    # Retries go on meanwhile (capped backoff), each judging x1 again from the store.
    retries = 0
    while retries < 6:
        now += 2.0
        out = core.handle(ev.TimerFired(RetryFetch(v1.cid, 0)), now)
        retries += 1
        assert _delivered(out) == []
    # Then x2 arrives (vouched, so x1 is too): everything in order, parents first.
    out = _receive(core, v1, x2, now=now + 0.1)
    _run_store(out, blocks)
    out = core.handle(ev.TimerFired(RetryFetch(v1.cid, 0)), now + 2.0)
    delivered = _delivered(out)
    assert delivered[0] == x1.cid
    assert sorted(delivered, key=bytes) == sorted([x1.cid, x2.cid, z.cid], key=bytes)


def test_adopting_a_revocation_fetches_the_history_it_records() -> None:
    """A reader that was away while v2 revoked Bob may find the way back to the history
    v2 records barred: Bob's e raced the revocation (v2 does not record it, so it is
    refused wherever v2 is known), and Carol, who had not heard of v2 yet, published c on
    e. Walking back from c stops at e, and what lies below it would never come. So
    adopting a version fetches the heads it records, which reach that history on their
    own."""
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id, CAROL.peer_id])
    x1 = _event(BOB, v1, b"x1", now=1100.0)
    v2 = _version(v1, [x1.cid], allowed_publishers=[CAROL.peer_id])
    blocks: dict[CID, bytes] = {}
    core = _reader(meta, v1, store=blocks)
    announcement = EventDescriptor.create(AUTHOR, meta.cid, v2.cid.raw, now=2500.0)
    core.handle(ev.Received(AUTHOR.peer_id, Event(meta.cid, announcement.block, 1)), 3001.1)
    out = core.handle(ev.BlockFetched(v2.cid, v2.block), 3001.15)
    assert core.latest(v1.cid) == v2
    asked = [o for o in out if (isinstance(o, ev.Fetch) and o.cid == x1.cid)
             or (isinstance(o, ev.Send) and isinstance(o.message, Want)
                 and o.message.head == x1.cid)]
    assert asked, out
    out = core.handle(ev.BlockFetched(x1.cid, x1.block), 3001.2)
    assert _rejected(out) == [] and _delivered(out) == [x1.cid]


def test_a_lineage_walked_outside_the_core_is_judged_by_the_core_rule() -> None:
    """The runtime resolves a version CID to its lineage by fetching parents; whether that
    chain is one topic's is decided by the same rule as TopicVersions.add."""
    from pulsar.proto.versions.lineage import MAX_VERSION_CHAIN, lineage_problem

    _, v1 = _topic(allowed_publishers=[BOB.peer_id])
    v2 = _version(v1, [], allowed_publishers=[CAROL.peer_id])
    assert lineage_problem([v1, v2]) is None
    forged = TopicDescriptor.create(BOB, "t", meta=v1.meta, parent=v1.cid, now=2000.0)
    assert "another author" in (lineage_problem([v1, forged]) or "")
    assert "does not follow" in (lineage_problem([v1, _version(v2, [])]) or "")
    chain = [v1]
    for i in range(MAX_VERSION_CHAIN):
        chain.append(TopicDescriptor.create(AUTHOR, "t", meta=v1.meta, parent=chain[-1].cid,
                                            now=2000.0 + i))
    assert lineage_problem(chain[:MAX_VERSION_CHAIN]) is None
    assert "longer than" in (lineage_problem(chain) or "")
