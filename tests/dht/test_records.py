"""Heads records in a real DHT on loopback: newest wins, liars lose, restarts keep them."""

from __future__ import annotations

from dag import Identity, TopicDescriptor
from dag.records import HeadsRecord
from dht.keys import record_replaces
from tests.waiting import eventually

from .conftest import Network

AUTHOR = Identity.from_seed(b"r" * 32)
META = TopicDescriptor.create(AUTHOR, "rec/meta")
TOPIC = TopicDescriptor.create(AUTHOR, "rec", meta=META.cid)


def _record(seq: int, who: Identity = AUTHOR) -> HeadsRecord:
    return HeadsRecord.create(who, TOPIC.cid, seq, TOPIC.cid, (META.cid,), now=float(seq))


def test_storage_takes_only_a_valid_record_newer_than_the_one_held() -> None:
    one, two = _record(1), _record(2)
    assert record_replaces(one.key, one.block, None)
    assert record_replaces(two.key, two.block, one.block)
    assert not record_replaces(one.key, one.block, two.block)  # older
    assert not record_replaces(one.key, one.block, one.block)  # not newer
    other = _record(3, Identity.from_seed(b"o" * 32))
    assert not record_replaces(one.key, other.block, None)  # another publisher's key


async def test_the_newest_record_is_found_by_a_node_that_never_held_it(network: Network) -> None:
    nodes = await network.grow(8)
    writer, reader = nodes[1], nodes[-1]
    assert await writer.put_record(_record(1)) > 0
    assert await writer.put_record(_record(2)) > 0
    found = await reader.get_record(TOPIC.cid, AUTHOR.peer_id)
    assert found is not None and found.seq == 2
    # A replayed older record is refused everywhere that holds the newer one.
    assert await nodes[2].put_record(_record(1)) == 0
    assert (await reader.get_record(TOPIC.cid, AUTHOR.peer_id)).seq == 2  # type: ignore[union-attr]
    assert await reader.get_record(TOPIC.cid, Identity.from_seed(b"x" * 32).peer_id) is None


async def test_a_record_put_with_a_quorum_returns_at_it_and_reaches_every_replica(
        network: Network) -> None:
    nodes = await network.grow(8)
    writer = nodes[1]
    acks = await writer.put_record(_record(1), quorum=1)
    assert acks == 1  # returned at the first acknowledgement
    key = _record(1).key
    await eventually(lambda: writer.stats.background_acks == 6)  # 7 others, 1 counted
    assert sum(n.records.get(key) is not None for n in nodes) == 8  # every replica has it


async def test_a_holder_serving_junk_does_not_win(network: Network) -> None:
    nodes = await network.grow(6)
    await nodes[0].put_record(_record(5))
    liar = nodes[1]
    # The liar's storage is bypassed: it answers FIND_VALUE with a forged "record".
    liar.records._table.put_many([(_record(5).key, b"\xa1atx" + b"\x00" * 40)], 0.0)
    found = await nodes[-1].get_record(TOPIC.cid, AUTHOR.peer_id)
    assert found is not None and found.seq == 5
    assert nodes[-1].stats.bad_values_fetched == 1  # the liar was asked, and not believed


async def test_a_record_survives_the_restart_of_its_holders(network: Network) -> None:
    nodes = await network.grow(4)
    await nodes[1].put_record(_record(9))
    for node in list(network.nodes[1:]):
        await network.stop(node)
    seed = network.nodes[0]
    await network.stop(seed)
    again = [await network.add(name="node1"), await network.add(name="node2")]
    found = await again[1].get_record(TOPIC.cid, AUTHOR.peer_id)
    assert found is not None and found.seq == 9
