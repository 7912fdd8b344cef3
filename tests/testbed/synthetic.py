"""Synthetic testbed runs for the QoS report: hand-written ones with known answers, and a
generated one the size of a 100-node run to time the job.

The generated run is shaped like the real thing (a tree per topic for Pulsarcast, flooding
over a random topic mesh for Floodsub, samples once a second, two nodes crashing and
restarting with a cut last line) so that the Spark job sees realistic record mixes and sizes,
but its numbers mean nothing. Time the report on one::

    .venv/bin/python -m tests.testbed.synthetic /tmp/run100 --nodes 100 --events 3000
    time .venv/bin/pulsarcast report /tmp/run100
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import string
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from pulsar.tools.testbed.delivery_logs import DELIVERY_LOGS, write_delivery_logs
from pulsar.tools.testbed.manifest import write_manifest

__all__ = ["large_run", "write_run"]

T0 = 1_763_900_000.0


def write_run(run_dir: Path, sections: Mapping[str, dict[str, Any]],
              traces: Mapping[str, Mapping[int, Iterable[dict[str, Any]]]],
              cut: Mapping[tuple[str, int], str] | None = None, name: str = "synthetic",
              logs: Mapping[str, Mapping[int, Mapping[str, list[str]] | None]] | None = None,
              ) -> Path:
    """A run directory: the manifest from ``sections`` (protocol → manifest section) and one
    trace file per (protocol, node) of ``traces``; ``cut`` appends a partial last line, as a
    node killed mid-write leaves; ``logs`` (protocol → node → topic → event CIDs, or None for
    a log that could not be read) writes the protocol's durable delivery logs, as the runner
    does at the end of a run (without it, the run has none, like one made before)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(run_dir, {"name": name, "scenario": {}, "protocols": dict(sections)})
    for protocol, nodes in traces.items():
        for node, records in nodes.items():
            path = run_dir / protocol / f"node-{node}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", encoding="utf-8") as out:
                for record in records:
                    out.write(json.dumps({"node": node, **record}, separators=(",", ":")) + "\n")
                out.write((cut or {}).get((protocol, node), ""))
    for protocol, nodes_logs in (logs or {}).items():
        (run_dir / protocol).mkdir(parents=True, exist_ok=True)
        ended = sections[protocol].get("ended", T0)
        write_delivery_logs(run_dir / protocol / DELIVERY_LOGS, ended, nodes_logs)
    return run_dir


def _cid(rng: random.Random, prefix: str = "bafyrei") -> str:
    return prefix + "".join(rng.choices(string.ascii_lowercase + "234567", k=52))


class _Files:
    """One open trace file per node; records are formatted by hand because json.dumps would
    make generating two million lines take minutes."""

    def __init__(self, directory: Path, nodes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.files: list[TextIO] = [
            open(directory / f"node-{i}.jsonl", "w", encoding="utf-8")  # noqa: SIM115
            for i in range(nodes)]
        self.records = 0
        self.logs: dict[int, dict[str, list[str]]] = {i: {} for i in range(nodes)}
        """Each node's delivery log, as the runner records it."""

    def write(self, node: int, line: str) -> None:
        self.files[node].write(line)
        self.records += 1

    def deliver(self, node: int, t: float, topic: str, event: str, hop: int) -> None:
        self.write(node, _deliver(t, node, topic, event, hop))
        self.logs[node].setdefault(topic, []).append(event)

    def close(self) -> None:
        for file in self.files:
            file.close()


class _Network:
    """The common workload: topics, subscribers, publish times, crashed nodes."""

    def __init__(self, rng: random.Random, nodes: int, topics: int, subscribers: int,
                 events: int) -> None:
        self.rng = rng
        self.nodes = nodes
        self.peers = [_cid(rng, "12D3KooW")[:52] for _ in range(nodes)]
        self.topics = []
        for index in range(topics):
            members = rng.sample(range(nodes), min(subscribers + 1, nodes))
            self.topics.append({"cid": _cid(rng), "name": f"topic-{index}", "author": members[0],
                                "order": index < 2, "subscribers": sorted(members[1:]),
                                "members": members})
        self.events = []
        last: dict[int, str | None] = {}
        for index in range(events):
            topic = index % topics
            cid = _cid(rng)
            self.events.append((T0 + 5 + 60 * index / events, topic, cid, last.get(topic)))
            last[topic] = cid
        self.down = {3: (T0 + 30, T0 + 40), 7: (T0 + 30, T0 + 40)}

    def is_down(self, node: int, t: float) -> bool:
        window = self.down.get(node)
        return window is not None and window[0] <= t < window[1]

    def section(self) -> dict[str, Any]:
        return {
            "started": T0, "publish_start": T0 + 5, "publish_end": T0 + 65, "ended": T0 + 75,
            "nodes": [{"index": i, "peer": p} for i, p in enumerate(self.peers)],
            "topics": [{k: v for k, v in t.items() if k != "members"} for t in self.topics],
            "faults": [{"t": T0 + 30, "kind": "crash", "nodes": sorted(self.down)},
                       {"t": T0 + 40, "kind": "restart", "nodes": sorted(self.down)}],
        }


def _message(kind: str, t: float, node: int, peer: str, topic: str, event: str, hop: int,
             msg: str = "event") -> str:
    tail = f',"msg":"{msg}"' if kind != "send" else ',"msg":"event"'
    return (f'{{"t":{t!r},"node":{node},"kind":"{kind}","peer":"{peer}","topic":"{topic}",'
            f'"event":"{event}","hop":{hop},"bytes":412{tail}}}\n')


def _deliver(t: float, node: int, topic: str, event: str, hop: int) -> str:
    return f'{{"t":{t!r},"node":{node},"kind":"deliver","topic":"{topic}","event":"{event}",' \
           f'"hop":{hop}}}\n'


def _publish(files: _Files, net: _Network, t: float, node: int, topic: str, event: str,
             parent: str | None) -> None:
    link = "null" if parent is None else f'"{parent}"'
    files.write(node, f'{{"t":{t!r},"node":{node},"kind":"publish","topic":"{topic}",'
                      f'"event":"{event}","parent":{link},"bytes":256}}\n')
    files.deliver(node, t, topic, event, 0)


def _tree_protocol(files: _Files, net: _Network) -> None:
    """Pulsarcast-like: a random tree per topic; a lost edge is repaired by a backfill."""
    rng = net.rng
    trees = []
    for topic in net.topics:
        members = topic["members"]
        trees.append({child: members[rng.randrange(max(1, i // 2 + 1), i + 1) - 1]
                      for i, child in enumerate(members) if i})
    for t0, ti, event, parent in net.events:
        topic = net.topics[ti]
        cid, root = topic["cid"], topic["author"]
        _publish(files, net, t0, root, cid, event, parent)
        arrival = {root: (t0, 0)}
        for child in topic["members"][1:]:
            up = trees[ti][child]
            if up not in arrival:
                continue
            t_up, hop = arrival[up]
            t = t_up + rng.uniform(0.002, 0.03)
            files.write(up, _message("send", t_up, up, net.peers[child], cid, event, hop + 1))
            if net.is_down(child, t):
                continue
            msg = "event"
            if rng.random() < 0.01:
                files.write(child, f'{{"t":{t!r},"node":{child},"kind":"backfill","peer":'
                                   f'"{net.peers[up]}","topic":"{cid}","event":"{event}",'
                                   f'"bytes":90}}\n')
                t, msg = t + rng.uniform(0.5, 2.0), "blocks"
            files.write(child, _message("receive", t, child, net.peers[up], cid, event, hop + 1,
                                        msg))
            files.deliver(child, t, cid, event, hop + 1)
            arrival[child] = (t, hop + 1)


def _flood_protocol(files: _Files, net: _Network, degree: int) -> None:
    """Floodsub-like: every node forwards its first copy to all its topic-mesh neighbours."""
    rng = net.rng
    meshes = []
    for topic in net.topics:
        members = topic["members"]
        links: dict[int, set[int]] = {m: set() for m in members}
        for i, m in enumerate(members[1:], 1):
            links[m].add(members[rng.randrange(i)])
        for m in members:
            while len(links[m]) < degree:
                other = rng.choice(members)
                if other != m:
                    links[m].add(other)
                    links[other].add(m)
        meshes.append(links)
    for t0, ti, event, parent in net.events:
        topic = net.topics[ti]
        cid, root = topic["cid"], topic["author"]
        _publish(files, net, t0, root, cid, event, parent)
        seen = {root}
        queue = [(t0, root, -1, 0)]
        while queue:
            t, node, sender, hop = heapq.heappop(queue)
            for peer in meshes[ti][node]:
                if peer == sender:
                    continue
                files.write(node, _message("send", t, node, net.peers[peer], cid, event, hop + 1))
                t_peer = t + rng.uniform(0.002, 0.03)
                if net.is_down(peer, t_peer):
                    continue
                if peer in seen:
                    files.write(peer, _message("duplicate", t_peer, peer, net.peers[node], cid,
                                               event, hop + 1))
                    continue
                seen.add(peer)
                files.write(peer, _message("receive", t_peer, peer, net.peers[node], cid, event,
                                           hop + 1))
                files.deliver(peer, t_peer, cid, event, hop + 1)
                heapq.heappush(queue, (t_peer, peer, node, hop + 1))


def _samples(files: _Files, net: _Network, scale: int) -> None:
    for node in range(net.nodes):
        life, sent, dht, cpu = 0, 0, 0, 0.0
        for second in range(76):
            t = T0 + second + 0.5
            if net.is_down(node, t):
                if sent:
                    # killed mid-write: the restarted process appends right after the cut
                    files.write(node, '{"t":' + repr(t) + ',"node":' + str(node) + ',"kind":"rec')
                    life, sent, dht, cpu = life + 1, 0, 0, 0.0
                continue
            sent += scale * net.rng.randint(500, 1500)
            dht += net.rng.randint(100, 300)
            cpu += net.rng.uniform(0.05, 0.2)
            files.write(node, f'{{"t":{t!r},"node":{node},"kind":"sample","cpu_s":{cpu:.3f},'
                              f'"rss":{60_000_000 + second * 10_000},"sent_bytes":{sent},'
                              f'"recv_bytes":{sent},"dht_sent_bytes":{dht},'
                              f'"dht_recv_bytes":{dht},"life":{life}}}\n')


def large_run(run_dir: Path, nodes: int = 100, topics: int = 10, subscribers: int = 40,
              events: int = 3000, degree: int = 6, seed: int = 1) -> dict[str, int]:
    """Write a generated run of both protocols; return the records written per protocol."""
    sections, counts = {}, {}
    for protocol in ("pulsarcast", "floodsub"):
        net = _Network(random.Random(seed), nodes, topics, subscribers, events)
        files = _Files(run_dir / protocol, nodes)
        if protocol == "pulsarcast":
            _tree_protocol(files, net)
        else:
            _flood_protocol(files, net, degree)
        _samples(files, net, scale=1 if protocol == "pulsarcast" else degree)
        files.close()
        sections[protocol] = net.section()
        write_delivery_logs(run_dir / protocol / DELIVERY_LOGS, sections[protocol]["ended"],
                            files.logs)
        counts[protocol] = files.records
    write_manifest(run_dir, {"name": "synthetic-large", "scenario": {}, "protocols": sections})
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description="write a synthetic testbed run")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--subscribers", type=int, default=40)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--degree", type=int, default=6)
    args = parser.parse_args()
    counts = large_run(args.run_dir, args.nodes, args.topics, args.subscribers, args.events,
                       args.degree)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
