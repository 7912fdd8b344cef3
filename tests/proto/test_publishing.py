"""Publishing in the core: what a node must know before it publishes, how it links, when
an event counts as persisted, and the heads records it leaves in the DHT."""

from __future__ import annotations

from typing import Any

from dag import CID, EventDescriptor, EventLinking, Identity, PeerId, PublishRule, TopicDescriptor
from dag.records import HeadsRecord
from pulsar.proto import events as ev
from pulsar.proto.core import CoreConfig, PulsarCore
from pulsar.proto.repair.messages import Joined, Want
from pulsar.proto.timers import RecordTimer
from pulsar.proto.tree.messages import Event, Join
from tests.helpers.records import record_written


class NoRouting:
    def closest_peers(self, key: bytes, count: int) -> list[PeerId]:
        return []


class OnePeer:
    def __init__(self, peer: PeerId) -> None:
        self.peer = peer

    def closest_peers(self, key: bytes, count: int) -> list[PeerId]:
        return [self.peer]


def _ident(i: int) -> Identity:
    return Identity.from_seed(bytes([i]) * 32)


AUTHOR, BOB, CHILD = _ident(1), _ident(2), _ident(5)


def _topic(**kw: Any) -> tuple[TopicDescriptor, TopicDescriptor]:
    meta = TopicDescriptor.create(AUTHOR, "t/meta", allowed_publishers=PublishRule(True, ()))
    return meta, TopicDescriptor.create(AUTHOR, "t", meta=meta.cid, now=1000.0, **kw)


def _of(kind: type, out: list[Any]) -> list[Any]:
    return [o for o in out if isinstance(o, kind)]


def _author(meta: TopicDescriptor, topic: TopicDescriptor, blocks: dict[CID, bytes]) -> PulsarCore:
    core = PulsarCore(AUTHOR, NoRouting(), lookup=blocks.get)
    core.handle(ev.Subscribe(meta, True, 0.0), 10.0)
    core.handle(ev.Subscribe(topic, True, 0.0), 10.0)
    return core


def _publish(core: PulsarCore, topic: CID, payload: bytes, request: int, now: float,
             acks: int = 2, blocks: dict[CID, bytes] | None = None) -> list[Any]:
    (store,) = _of(ev.StoreDht, core.handle(ev.Publish(topic, payload, None, request), now))
    if blocks is not None:
        blocks[store.cid] = store.block
    return record_written(core, core.handle(ev.DhtStored(store.cid, acks), now + 0.01),
                          now + 0.01)


def test_an_event_not_acknowledged_by_enough_dht_nodes_is_neither_published_nor_sent() -> None:
    meta, topic = _topic()
    core = _author(meta, topic, {})
    core.handle(ev.Received(CHILD.peer_id, Join(topic.cid, topic.block)), 10.5)
    out = _publish(core, topic.cid, b"lost", 1, 11.0, acks=0)
    assert _of(ev.Send, out) == [] and _of(ev.Published, out) == []
    (failed,) = _of(ev.CommandFailed, out)
    assert failed.request == 1 and "fewer than the 1 required" in failed.reason
    # The next event does not link to the one that failed.
    (store,) = _of(ev.StoreDht, core.handle(ev.Publish(topic.cid, b"next", None, 2), 12.0))
    assert EventDescriptor.from_block(store.block).parent is None


def test_after_a_failed_chain_the_next_event_links_to_the_last_persisted_one() -> None:
    """E1 fails, then E2 (linking E1, stored later) fails behind it: the next event must
    link to E0, not to E1, or every event after an outage would fail too."""
    meta, topic = _topic()
    core = _author(meta, topic, {})
    (s0,) = _of(ev.StoreDht, core.handle(ev.Publish(topic.cid, b"e0", None, 1), 11.0))
    core.handle(ev.DhtStored(s0.cid, 1), 11.0)
    (s1,) = _of(ev.StoreDht, core.handle(ev.Publish(topic.cid, b"e1", None, 2), 12.0))
    (s2,) = _of(ev.StoreDht, core.handle(ev.Publish(topic.cid, b"e2", None, 3), 12.1))
    assert EventDescriptor.from_block(s2.block).parent == s1.cid
    core.handle(ev.DhtStored(s1.cid, 0), 13.0)  # the network is gone
    out = core.handle(ev.DhtStored(s2.cid, 1), 13.1)  # stored, but its parent failed
    assert [f.request for f in _of(ev.CommandFailed, out)] == [3]
    (s3,) = _of(ev.StoreDht, core.handle(ev.Publish(topic.cid, b"e3", None, 4), 14.0))
    assert EventDescriptor.from_block(s3.block).parent == s0.cid
    out = core.handle(ev.DhtStored(s3.cid, 1), 14.1)
    assert _of(ev.CommandFailed, out) == []


def test_a_heads_record_never_names_an_event_still_being_stored() -> None:
    """Found by pulsarcast verify (seed 13): a record written while an event's store was
    in flight named it; the store then missed the quorum, and a fresh reader's replay
    could never complete (the record pointed at a block nobody had)."""
    meta, topic = _topic()
    core = _author(meta, topic, {})
    (s0,) = _of(ev.StoreDht, core.handle(ev.Publish(topic.cid, b"e0", None, 1), 11.0))
    core.handle(ev.DhtStored(s0.cid, 1), 11.0)
    (s1,) = _of(ev.StoreDht, core.handle(ev.Publish(topic.cid, b"e1", None, 2), 12.0))
    (stored,) = _of(ev.StoreRecord, core.handle(ev.Flush(), 12.1))  # e1 still in flight
    assert stored.record.heads == (s0.cid,)
    core.handle(ev.DhtStored(s1.cid, 0), 12.2)  # and it fails


def test_a_restarted_author_builds_on_its_latest_version_and_links_to_its_last_event() -> None:
    meta, topic = _topic(allowed_publishers=[BOB.peer_id])
    blocks: dict[CID, bytes] = {}
    core = _author(meta, topic, blocks)
    _publish(core, topic.cid, b"first", 1, 11.0, blocks=blocks)
    (last,) = [o.event for o in _publish(core, topic.cid, b"second", 2, 12.0, blocks=blocks)
               if isinstance(o, ev.Published)]
    v2 = TopicDescriptor.create(AUTHOR, "t", meta=meta.cid, parent=topic.cid,
                                allowed_publishers=[], now=13.0)
    # A new process: what the durable store had is all it gets.
    restarted = PulsarCore(AUTHOR, NoRouting(), lookup=blocks.get)
    restarted.handle(ev.Subscribe(topic, True, 0.0, (last.cid, last.parent), (v2,)), 20.0)  # type: ignore[arg-type]
    assert restarted.latest(topic.cid) == v2
    (store,) = _of(ev.StoreDht, restarted.handle(ev.Publish(topic.cid, b"third", None, 3), 21.0))
    third = EventDescriptor.from_block(store.block)
    assert third.parent == last.cid and third.topic == v2.cid
    out = restarted.handle(ev.UpdateTopic(4, topic.cid), 22.0)
    assert TopicDescriptor.from_block(_of(ev.StoreDht, out)[0].block).parent == v2.cid


def test_a_node_that_does_not_follow_the_topic_learns_version_and_heads_before_publishing() -> None:
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    blocks = {meta.cid: meta.block}
    head = EventDescriptor.create(AUTHOR, v1.cid, b"latest so far", now=1500.0)
    v2 = TopicDescriptor.create(AUTHOR, "t", meta=meta.cid, parent=v1.cid,
                                allowed_publishers=[BOB.peer_id], now=1600.0)
    bob = PulsarCore(BOB, OnePeer(AUTHOR.peer_id), lookup=blocks.get)
    out = bob.handle(ev.Subscribe(v1, False), 2000.0)
    out = bob.handle(ev.Publish(v1.cid, b"hello", None, 1), 2000.1)
    assert _of(ev.StoreDht, out) == []  # nothing is published before it knows
    assert out == [ev.FetchRecords(v1.cid, (AUTHOR.peer_id,))]  # not its own: it knows it
    record = HeadsRecord.create(AUTHOR, v1.cid, 5, v2.cid, (head.cid,), now=1700.0)
    out = bob.handle(ev.RecordsFetched(v1.cid, (record,)), 2000.2)
    assert ev.Fetch(v2.cid) in out and _of(ev.StoreDht, out) == []
    out = bob.handle(ev.BlockFetched(v2.cid, v2.block), 2000.3)
    assert _of(ev.StoreDht, out) == []  # and not before its parent took it in the tree
    out = bob.handle(ev.Received(AUTHOR.peer_id, Joined(v1.cid, ())), 2000.4)
    (store,) = _of(ev.StoreDht, out)
    event = EventDescriptor.from_block(store.block)
    assert event.parent == head.cid and event.topic == v2.cid


def test_a_revoked_node_learns_it_before_publishing() -> None:
    meta, v1 = _topic(allowed_publishers=[BOB.peer_id])
    v2 = TopicDescriptor.create(AUTHOR, "t", meta=meta.cid, parent=v1.cid,
                                allowed_publishers=[], now=1600.0)
    bob = PulsarCore(BOB, NoRouting(), lookup={meta.cid: meta.block, v2.cid: v2.block}.get)
    bob.handle(ev.Subscribe(v1, False), 2000.0)
    # Knowing nobody, bob asks the author itself, who cannot be reached: bob acts as root.
    bob.handle(ev.SendFailed(AUTHOR.peer_id), 2000.05)
    (fetch,) = bob.handle(ev.Publish(v1.cid, b"sneaky", None, 1), 2000.1)
    assert isinstance(fetch, ev.FetchRecords)
    record = HeadsRecord.create(AUTHOR, v1.cid, 1, v2.cid, (), now=1700.0)
    out = bob.handle(ev.RecordsFetched(v1.cid, (record,)), 2000.2)
    out += bob.handle(ev.BlockFetched(v2.cid, v2.block), 2000.3)
    assert _of(ev.StoreDht, out) == []
    assert _of(ev.CommandFailed, out) == [
        ev.CommandFailed(1, "not allowed to publish or to request it")
    ]


def test_a_custom_parent_must_exist_and_be_an_event_of_the_topic() -> None:
    meta, topic = _topic(event_linking=EventLinking.CUSTOM)
    blocks: dict[CID, bytes] = {}
    core = _author(meta, topic, blocks)
    missing = CID.parse("bafyreidykglsfhoixmivffc5uwhcgshx4j465xwqntbmu43nb2dzqwfvae")
    out = core.handle(ev.Publish(topic.cid, b"x", missing, 1), 11.0)
    assert out == [ev.Fetch(missing)]
    out = core.handle(ev.BlockFetched(missing, None), 11.5)
    assert out == [ev.CommandFailed(1, f"parent {missing} not found")]
    other = TopicDescriptor.create(AUTHOR, "other", meta=meta.cid)
    stranger = EventDescriptor.create(AUTHOR, other.cid, b"elsewhere")
    blocks[stranger.cid] = stranger.block
    out = core.handle(ev.Publish(topic.cid, b"x", stranger.cid, 2), 12.0)
    assert out == [ev.CommandFailed(2, f"parent {stranger.cid} is not a valid event of this topic")]
    (published,) = [o.event for o in _publish(core, topic.cid, b"root", 3, 13.0, blocks=blocks)
                    if isinstance(o, ev.Published)]
    out = core.handle(ev.Publish(topic.cid, b"child", published.cid, 4), 14.0)
    assert EventDescriptor.from_block(_of(ev.StoreDht, out)[0].block).parent == published.cid


def test_publishing_writes_a_heads_record_with_the_latest_version() -> None:
    meta, topic = _topic()
    blocks: dict[CID, bytes] = {}
    core = _author(meta, topic, blocks)
    (store,) = _of(ev.StoreDht, core.handle(ev.Publish(topic.cid, b"a", None, 1), 11.0))
    blocks[store.cid] = store.block
    out = core.handle(ev.DhtStored(store.cid, 1), 11.01)
    # Not acknowledged yet: the record naming it is written at once, then the publish.
    assert _of(ev.Published, out) == []
    timer = RecordTimer(topic.cid, 11.01)
    assert ev.SetTimer(0.0, timer) in out
    (stored,) = core.handle(ev.TimerFired(timer), 11.01)
    assert isinstance(stored, ev.StoreRecord)
    record = stored.record
    assert (record.topic, record.publisher, record.version) == (topic.cid, AUTHOR.peer_id,
                                                               topic.cid)
    assert record.heads == (store.cid,) and record.seq >= 11_010
    assert core.handle(ev.TimerFired(timer), 11.02) == []  # written: that timer is spent
    out = core.handle(ev.RecordStored(topic.cid, record.seq, 1), 11.03)
    assert [o.event.cid for o in _of(ev.Published, out)] == [store.cid]
    # A new version is written at once, overtaking a slower write already armed.
    _publish(core, topic.cid, b"b", 2, 11.6, blocks=blocks)
    out = core.handle(ev.UpdateTopic(3, topic.cid), 11.62)
    out = core.handle(ev.DhtStored(out[0].cid, 2), 11.63)
    (now,) = [o for o in out if isinstance(o, ev.SetTimer) and isinstance(o.timer, RecordTimer)]
    assert now.delay == 0.0
    (again,) = core.handle(ev.TimerFired(now.timer), 11.63)
    assert again.record.seq > record.seq and again.record.version != topic.cid
    assert core.handle(ev.TimerFired(RecordTimer(topic.cid, 12.11)), 12.11) == []


def test_a_replay_subscription_finds_the_heads_in_the_dht_with_nobody_online() -> None:
    meta, topic = _topic()
    head = EventDescriptor.create(AUTHOR, topic.cid, b"only in the DHT", now=1500.0)
    reader = PulsarCore(BOB, NoRouting(), lookup={meta.cid: meta.block}.get)
    out = reader.handle(ev.Subscribe(topic, True, 0.0), 3000.0)
    assert ev.FetchRecords(topic.cid, (AUTHOR.peer_id,)) in out
    record = HeadsRecord.create(AUTHOR, topic.cid, 1, topic.cid, (head.cid,), now=1600.0)
    out = reader.handle(ev.RecordsFetched(topic.cid, (record,)), 3000.1)
    assert ev.Fetch(head.cid) in out  # nobody to ask: straight to the DHT
    out = reader.handle(ev.BlockFetched(head.cid, head.block), 3000.2)
    assert [o.event for o in out if isinstance(o, ev.Deliver)] == [head]


def test_a_recent_event_taken_in_by_repair_goes_down_the_tree() -> None:
    meta, topic = _topic()
    relay = PulsarCore(BOB, OnePeer(AUTHOR.peer_id), lookup={meta.cid: meta.block}.get)
    relay.handle(ev.Subscribe(topic, True), 100.0)
    relay.handle(ev.Received(CHILD.peer_id, Join(topic.cid, topic.block)), 100.1)
    e1 = EventDescriptor.create(AUTHOR, topic.cid, b"1", now=100.2)
    e2 = EventDescriptor.create(AUTHOR, topic.cid, b"2", parent=e1.cid, now=100.3)
    out = relay.handle(ev.Received(AUTHOR.peer_id, Event(topic.cid, e2.block, 1)), 100.4)
    (want,) = [o for o in _of(ev.Send, out) if isinstance(o.message, Want)]
    assert want.peer == AUTHOR.peer_id and want.message.head == e1.cid
    from pulsar.proto.repair.messages import Blocks

    out = relay.handle(ev.Received(AUTHOR.peer_id, Blocks(topic.cid, e1.cid, (e1.block,))), 100.5)
    pushed = [o for o in _of(ev.Send, out) if isinstance(o.message, Event)]
    assert [(o.peer, o.message.block) for o in pushed] == [(CHILD.peer_id, e1.block)]


def test_a_stopping_node_writes_the_heads_record_it_had_armed() -> None:
    meta, topic = _topic()
    blocks: dict[CID, bytes] = {}
    core = _author(meta, topic, blocks)
    (store,) = _of(ev.StoreDht, core.handle(ev.Publish(topic.cid, b"last", None, 1), 11.0))
    core.handle(ev.DhtStored(store.cid, 1), 11.01)
    (stored,) = core.handle(ev.Flush(), 11.01)  # before the armed timer fired
    assert isinstance(stored, ev.StoreRecord) and stored.record.heads == (store.cid,)
    assert core.handle(ev.Flush(), 11.2) == []  # nothing left armed
    out = core.handle(ev.RecordStored(topic.cid, stored.record.seq, 1), 11.3)
    assert [o.request for o in _of(ev.Published, out)] == [1]


def _stored(core: PulsarCore, topic: CID, payload: bytes, request: int, now: float) -> CID:
    """Publish and answer the event's DHT store: forwarded, waiting for its record."""
    (store,) = _of(ev.StoreDht, core.handle(ev.Publish(topic, payload, None, request), now))
    core.handle(ev.DhtStored(store.cid, 1), now)
    return store.cid


def _write(core: PulsarCore, topic: CID, now: float) -> HeadsRecord:
    (stored,) = _of(ev.StoreRecord, core.handle(
        ev.TimerFired(RecordTimer(topic, core._trees[topic].record_due or 0.0)), now))
    return stored.record


def test_publishes_during_a_record_write_share_the_next_one() -> None:
    meta, topic = _topic()
    core = _author(meta, topic, {})
    first = _stored(core, topic.cid, b"1", 1, 11.0)
    one = _write(core, topic.cid, 11.0)
    second = _stored(core, topic.cid, b"2", 2, 11.1)
    third = _stored(core, topic.cid, b"3", 3, 11.2)
    # One write in flight per tree: the timer armed meanwhile writes nothing yet.
    assert core.handle(ev.TimerFired(RecordTimer(topic.cid, 11.1)), 11.2) == []
    out = core.handle(ev.RecordStored(topic.cid, one.seq, 2), 11.3)
    assert [o.request for o in _of(ev.Published, out)] == [1]
    two = _write(core, topic.cid, 11.3)
    assert third in two.heads and first not in two.heads and second not in two.heads
    out = core.handle(ev.RecordStored(topic.cid, two.seq, 2), 11.4)
    assert [o.request for o in _of(ev.Published, out)] == [2, 3]
    assert core._trees[topic.cid].record_due is None  # nothing more to write


def test_a_record_that_misses_the_quorum_is_written_again_then_the_publish_fails() -> None:
    meta, topic = _topic()
    core = _author(meta, topic, {})
    _stored(core, topic.cid, b"x", 1, 11.0)
    now = 11.0
    for attempt in range(core.config.record_retries):
        record = _write(core, topic.cid, now)
        out = core.handle(ev.RecordStored(topic.cid, record.seq, 0), now)
        (again,) = [o for o in out if isinstance(o, ev.SetTimer)]
        assert again.delay == core.config.record_delay * 2 ** attempt  # backing off
        assert _of(ev.Published, out) == [] and _of(ev.CommandFailed, out) == []
        now += again.delay
    record = _write(core, topic.cid, now)
    out = core.handle(ev.RecordStored(topic.cid, record.seq, 0), now)
    (failed,) = _of(ev.CommandFailed, out)
    assert failed.request == 1 and failed.kind == "unrecorded"
    assert "may still be delivered" in failed.reason
    assert core.counters()["record_quorum_failed"] == 1


def test_a_lone_node_acknowledges_without_a_record() -> None:
    meta, topic = _topic()
    core = PulsarCore(AUTHOR, NoRouting(), CoreConfig(min_acks=0), lookup={}.get)
    core.handle(ev.Subscribe(meta, True, 0.0), 10.0)
    core.handle(ev.Subscribe(topic, True, 0.0), 10.0)
    (store,) = _of(ev.StoreDht, core.handle(ev.Publish(topic.cid, b"x", None, 1), 11.0))
    out = core.handle(ev.DhtStored(store.cid, 0), 11.01)
    assert [o.request for o in _of(ev.Published, out)] == [1]


def test_a_walk_started_on_the_dht_moves_to_a_neighbour_that_names_the_same_head() -> None:
    """The heads records may answer before the parent's JOINED: the walk back starts on
    the DHT (one block per look-up) and goes on by WANT (hundreds per round trip) as soon
    as a neighbour names the same head."""
    meta, topic = _topic()
    first = EventDescriptor.create(AUTHOR, topic.cid, b"1", now=1500.0)
    head = EventDescriptor.create(AUTHOR, topic.cid, b"2", parent=first.cid, now=1501.0)
    reader = PulsarCore(BOB, OnePeer(AUTHOR.peer_id), lookup={meta.cid: meta.block}.get)
    reader.handle(ev.Subscribe(topic, True, 0.0), 3000.0)
    record = HeadsRecord.create(AUTHOR, topic.cid, 1, topic.cid, (head.cid,), now=1600.0)
    assert ev.Fetch(head.cid) in reader.handle(ev.RecordsFetched(topic.cid, (record,)), 3000.1)
    reader.handle(ev.Received(AUTHOR.peer_id, Joined(topic.cid, (head.cid,))), 3000.2)
    out = reader.handle(ev.BlockFetched(head.cid, head.block), 3000.3)
    wants = [o for o in _of(ev.Send, out) if isinstance(o.message, Want)]
    assert [(w.peer, w.message.head) for w in wants] == [(AUTHOR.peer_id, first.cid)]
    assert ev.Fetch(first.cid) not in out
