"""The simulator's DHT loses datagrams like the pub-sub does: a lost STORE stores nothing,
a lost answer acknowledges nothing, and a get round with no answer costs an RPC timeout."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from dag import Identity, cid_of
from pulsar.proto import events as ev
from pulsar.tools.sim.dht import ALPHA, SimDht, block_key
from pulsar.tools.sim.network import DHT_RPC_TIMEOUT, SimNetwork
from pulsar.tools.sim.routing import IdSpace

PEERS = [Identity.from_seed(bytes([i + 1]) * 32).peer_id for i in range(20)]


def _script(*fates: bool) -> Callable[[], bool]:
    """``lost`` answering ``fates`` in order, then never again."""
    it: Iterator[bool] = iter(fates)
    return lambda: next(it, False)


def test_a_lost_store_stores_nothing_and_a_lost_answer_acknowledges_nothing() -> None:
    dht = SimDht(IdSpace(PEERS), replicas=4)
    block = b"\xa0"
    cid = cid_of(block)
    # Draws per holder: request lost?, then (if it arrived) answer lost?
    acked, lost = dht.put_block(cid, block, lambda p: True, _script(True, False, True))
    holders = dht.holders(block_key(cid), lambda p: True)
    assert lost and len(acked) == 2  # holder 1: request lost; holder 2: answer lost
    stored = [p for p in holders if cid in dht.blocks.get(p, {})]
    assert stored == holders[1:]  # holder 2 stored it though its answer was lost
    assert acked == holders[2:]


def test_a_get_stalls_one_timeout_per_round_with_no_answer() -> None:
    dht = SimDht(IdSpace(PEERS), replicas=6)
    block = b"\xa1"
    cid = cid_of(block)
    dht.put_block(cid, block, lambda p: True)
    # The first round's three requests are all lost: one stall, then the next round answers.
    found, stalls = dht.get_block(cid, lambda p: True, _script(*([True] * ALPHA)))
    assert found == block and stalls == 1
    found, stalls = dht.get_block(cid, lambda p: True, lambda: True)
    assert found is None and stalls == 2  # six holders, two rounds, nothing answered
    assert dht.get_block(cid, lambda p: True) == (block, 0)


def test_under_loss_some_fetches_wait_out_an_rpc_timeout() -> None:
    """At 50 % loss a fetch from the DHT sometimes has a round with no answer, and the
    simulated time its answer is scheduled at shows it; without loss every fetch is one
    round trip."""

    def fetch_delays(loss: float) -> list[float]:
        net = SimNetwork(12, seed=3, loss=loss, latency=0.01)
        node = net.node(0)
        delays: list[float] = []
        for i in range(40):
            block = b"\x41" + bytes([i])
            cid = cid_of(block)
            net.dht.put_block(cid, block, lambda p: True)
            net._apply(node, [ev.Fetch(cid)])
            (when,) = [at for at, _, _, event in net._queue
                       if isinstance(event, ev.BlockFetched) and event.cid == cid]
            delays.append(when - net.now)
        return delays

    assert max(fetch_delays(0.0)) < 1.0
    assert max(fetch_delays(0.5)) >= DHT_RPC_TIMEOUT
