"""The ``pulsarcast`` command line.

Subcommands are registered in small functions so each feature owns its flags; heavy imports
happen inside the handlers, so ``pulsarcast --help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from pulsar.runtime.loop import LOOP_ENV, LOOPS
from pulsar.runtime.loop import run as run_loop
from pulsar.tools.bench.command import add_bench

__all__ = ["main"]


def _devnet(args: argparse.Namespace) -> int:
    from pathlib import Path

    # The API sits above the node (api -> pulsar); only the command line reaches up to it.
    from .runner import run_devnet

    data_dir = Path(args.data_dir) if args.data_dir else None
    return run_loop(run_devnet(args.nodes, data_dir, args.json, args.base_port,
                                  args.api_base_port, args.api_host))


def _add_devnet(sub: Any) -> None:
    devnet = sub.add_parser("devnet", help="run a local network of nodes, each with its REST "
                            "API, on 127.0.0.1")
    devnet.add_argument("--nodes", type=int, default=5, help="how many nodes (default 5)")
    devnet.add_argument("--data-dir", default=None, help="keep node data here (default: temp)")
    devnet.add_argument("--base-port", type=int, default=0,
                        help="first p2p port (default: any free one)")
    devnet.add_argument("--api-base-port", type=int, default=0,
                        help="first REST API port (default: any free one)")
    devnet.add_argument("--api-host", default="127.0.0.1", help="REST API bind address")
    devnet.add_argument("--json", action="store_true", help="one JSON object per node "
                        "(url, token, peer_id, address, data_dir)")
    devnet.set_defaults(handler=_devnet)


_NODE_DEFAULTS: dict[str, Any] = {
    "data_dir": None,
    "host": "127.0.0.1",
    "port": 0,
    "bootstrap": [],
    "api_host": "127.0.0.1",
    "api_port": 8700,
    "token": None,
    "min_acks": 1,
    "replicas": 8,
}
"""Settings of ``pulsarcast node``: a flag given on the command line wins over the config
file (``--config``, TOML, the same names with underscores), which wins over these."""


def _node_settings(args: argparse.Namespace) -> dict[str, Any]:
    import tomllib

    settings = dict(_NODE_DEFAULTS)
    if args.config:
        try:
            with open(args.config, "rb") as file:
                loaded = tomllib.load(file)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SystemExit(f"cannot read config {args.config}: {exc}") from None
        unknown = set(loaded) - set(_NODE_DEFAULTS)
        if unknown:
            raise SystemExit(f"{args.config}: unknown settings {sorted(unknown)}; known: "
                             f"{sorted(_NODE_DEFAULTS)}")
        settings.update(loaded)
    for name in _NODE_DEFAULTS:
        given = getattr(args, name)
        if given is not None and given != []:
            settings[name] = given
    if not settings["data_dir"]:
        raise SystemExit("a data directory is required: --data-dir or data_dir in --config")
    for name, kind in (("port", int), ("api_port", int)):
        if not isinstance(settings[name], kind) or not 0 <= settings[name] <= 65535:
            raise SystemExit(f"{name} must be a port number, not {settings[name]!r}")
    if not isinstance(settings["bootstrap"], list):
        raise SystemExit("bootstrap must be a list of \"HOST:PORT\" strings")
    if type(settings["min_acks"]) is not int or not 0 <= settings["min_acks"] <= 20:
        raise SystemExit(f"min_acks must be an integer in 0..20, not {settings['min_acks']!r}")
    if type(settings["replicas"]) is not int or not 1 <= settings["replicas"] <= 20:
        raise SystemExit(f"replicas must be an integer in 1..20, not {settings['replicas']!r}")
    if settings["min_acks"] > settings["replicas"]:
        raise SystemExit(f"min_acks ({settings['min_acks']}) cannot exceed replicas "
                         f"({settings['replicas']}): the quorum could never be met")
    return settings


def _node(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dht import DhtConfig
    from pulsar.config import NodeConfig
    from pulsar.proto.core import CoreConfig

    from .runner import run_node

    settings = _node_settings(args)
    if settings["token"] is not None:
        from api.auth import check_token

        try:
            check_token(settings["token"])
        except ValueError as exc:
            raise SystemExit(f"--token: {exc}") from None
    bootstrap = tuple(_host_port(str(b)) for b in settings["bootstrap"])
    try:
        config = NodeConfig(data_dir=Path(settings["data_dir"]), host=settings["host"],
                            port=settings["port"], bootstrap=bootstrap,
                            core=CoreConfig(min_acks=settings["min_acks"]),
                            dht=DhtConfig(replicas=settings["replicas"]))
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return run_loop(run_node(config, settings["api_host"], settings["api_port"],
                                settings["token"], args.json, gc_freeze=args.gc == "freeze"))


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"bootstrap takes HOST:PORT, not {value!r}")
    return host, int(port)


def _add_node(sub: Any) -> None:
    node = sub.add_parser("node", help="run one node with its REST API until Ctrl-C")
    node.add_argument("--config", default=None, metavar="FILE.toml",
                      help="settings file (TOML: data_dir, host, port, bootstrap, api_host, "
                      "api_port, token, min_acks, replicas); flags override it")
    node.add_argument("--data-dir", default=None, help="key, database and API token live here")
    node.add_argument("--host", default=None, help="p2p bind address (default 127.0.0.1)")
    node.add_argument("--port", type=int, default=None,
                      help="p2p port, UDP and TCP (default any)")
    node.add_argument("--bootstrap", action="append", default=[], metavar="HOST:PORT",
                      help="a node to join through (repeatable)")
    node.add_argument("--api-host", default=None,
                      help="REST API bind address (default 127.0.0.1)")
    node.add_argument("--api-port", type=int, default=None,
                      help="REST API port (default 8700)")
    node.add_argument("--token", default=None,
                      help="API token (default: generated into the data dir)")
    node.add_argument("--min-acks", type=int, default=None,
                      help="DHT nodes that must store an event before it is published "
                      "(default 1; 0 for a node that runs alone on purpose)")
    node.add_argument("--replicas", type=int, default=None,
                      help="DHT nodes each block is stored at (default 8, at most 20; see "
                      "docs/architecture.md, 'How many replicas')")
    node.add_argument("--json", action="store_true", help="print the node's details as JSON")
    node.add_argument("--gc", choices=["freeze", "default"], default="freeze",
                      help="freeze (default): hold the garbage collector back while the node "
                      "rejoins its trees, then freeze what is alive; default: Python's own")
    node.set_defaults(handler=_node)


# ------------------------------------------------------------------ REST API client commands
# These talk to a running node through its REST API (api.client), so they work against
# ``make run`` (node 0 listens on 127.0.0.1:8701) or any ``pulsarcast node``.

API_URL = "http://127.0.0.1:8701"


def _api_options(output: bool = True) -> argparse.ArgumentParser:
    """--url and --token (defaults from the env), and --json unless the command uses that
    name for something else (publish's payload)."""
    import os

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("PULSARCAST_URL", API_URL),
                        help="the node's REST API (default $PULSARCAST_URL or "
                        f"{API_URL}, make run's node 0)")
    common.add_argument("--token", default=os.environ.get("PULSARCAST_TOKEN"),
                        help="API token for calls that change state (default "
                        "$PULSARCAST_TOKEN)")
    if output:
        common.add_argument("--json", action="store_true",
                            help="machine-readable output: one JSON object per line")
    return common


def _api_command(run: Any) -> Any:
    """Wrap ``async run(client, args) -> int`` as a handler: problems and unreachable nodes
    become one line on stderr and exit status 1, never a traceback."""

    def handler(args: argparse.Namespace) -> int:
        import aiohttp

        from api.client import ApiError, PulsarcastClient

        async def go() -> int:
            async with PulsarcastClient(args.url, args.token) as client:
                result: int = await run(client, args)
                return result

        try:
            return run_loop(go())
        except ApiError as exc:
            hint = " (pass --token or set PULSARCAST_TOKEN)" if exc.status == 401 else ""
            print(f"pulsarcast: {exc.kind} ({exc.status}): {exc.detail}{hint}",
                  file=sys.stderr)
        except aiohttp.ClientConnectorError as exc:
            reason = exc.os_error.strerror or str(exc.os_error)
            print(f"pulsarcast: cannot reach the node at {args.url}: {reason}",
                  file=sys.stderr)
        except (aiohttp.ClientError, TimeoutError) as exc:
            print(f"pulsarcast: request to {args.url} failed: {exc or type(exc).__name__}",
                  file=sys.stderr)
        except BrokenPipeError:  # `pulsarcast replay ... | head`: the reader left; fine
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        return 1

    return handler


def _emit(args: argparse.Namespace, value: Any, human: str) -> None:
    print(json.dumps(value) if getattr(args, "json", False) else human, flush=True)


def _topic_text(topic: dict[str, Any]) -> str:
    def rule(r: dict[str, Any], off: str) -> str:
        if not r["enabled"]:
            return off
        return ", ".join(r["peers"]) or "on"

    subtopics = ", ".join(f"{k}={v}" for k, v in topic["subtopics"].items()) or "-"
    rows = [
        ("cid", topic["cid"]),
        ("name", topic["name"]),
        ("author", topic["author"]),
        ("parent", topic["parent"] or "-"),
        ("created", topic["created"]),
        ("publishers", rule(topic["allowed_publishers"], "anyone")),
        ("request-to-publish", rule(topic["request_to_publish"], "off")),
        ("linking", topic["event_linking"]),
        ("subtopics", subtopics),
        ("retention", _retention_text(topic.get("retention"))),
    ]
    return "\n".join(f"{k + ':':<20}{v}" for k, v in rows)


def _retention_text(retention: dict[str, Any] | None) -> str:
    if not retention:
        return "everything"
    kept = []
    if retention.get("max_events") is not None:
        kept.append(f"the newest {retention['max_events']:,} events")
    if retention.get("max_age") is not None:
        kept.append(f"{retention['max_age']:,} s")
    text = " and ".join(kept)
    if retention.get("compact"):
        text = f"{text}, compacted by key" if text else "the newest event of each key"
    return text


def _retention_arg(args: argparse.Namespace) -> dict[str, int | bool] | None:
    policy: dict[str, int | bool] = {
        k: v for k, v in (("max_age", args.max_age), ("max_events", args.max_events))
        if v is not None}
    if getattr(args, "compact", False):
        policy["compact"] = True
    return policy or None


def _payload_text(event: dict[str, Any]) -> str:
    """JSON payloads as compact JSON, printable text as it is, other text JSON-quoted,
    binary as base64."""
    from api.client import payload_of

    if "json" in event:
        return json.dumps(event["json"], separators=(",", ":"), ensure_ascii=False)
    try:
        text = event["text"] if "text" in event else payload_of(event).decode()
    except UnicodeDecodeError:
        return f"base64:{event['payload']}"
    return text if text.isprintable() else json.dumps(text, ensure_ascii=False)


def _event_line(event: dict[str, Any]) -> str:
    seq = f"#{event['seq']} " if "seq" in event else ""
    return f"{seq}{event['cid']} {_payload_text(event)}"


async def _topic_create(client: Any, args: argparse.Namespace) -> int:
    topic = await client.create_topic(
        args.name, allowed_publishers=args.allowed_publisher or None,
        request_to_publish=True if args.request_to_publish else None,
        event_linking="CUSTOM" if args.custom_linking else None,
        retention=_retention_arg(args))
    if not args.json and not sys.stdout.isatty():
        # Piped or captured (`CID=$(pulsarcast topic create news)`): the CID alone.
        print(topic["cid"], flush=True)
    else:
        _emit(args, topic, _topic_text(topic))
    return 0


async def _topic_show(client: Any, args: argparse.Namespace) -> int:
    topic = await client.get_topic(args.cid)
    _emit(args, topic, _topic_text(topic))
    return 0


async def _topic_update(client: Any, args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {}
    if args.name is not None:
        changes["name"] = args.name
    if args.allowed_publisher:
        changes["allowed_publishers"] = args.allowed_publisher
    if args.anyone:
        changes["allowed_publishers"] = None
    if _retention_arg(args) is not None:
        changes["retention"] = _retention_arg(args)
    if args.keep_all:
        changes["retention"] = None
    if not changes:
        print("pulsarcast: nothing to change (give --name, --allowed-publisher, --anyone, "
              "--max-age, --max-events, --compact or --keep-all)", file=sys.stderr)
        return 2
    topic = await client.update_topic(args.cid, **changes)
    _emit(args, topic, _topic_text(topic))
    return 0


LINES_BATCH = 1000
"""Lines of ``publish --lines`` per request (the node's limit on a batch)."""


async def _publish_lines(client: Any, args: argparse.Namespace) -> int:
    """Each line of a file (or stdin) one text event, as Kafka's console producer does,
    sent in batches of :data:`LINES_BATCH`; empty lines are skipped. The new CIDs go to
    stdout one a line (with ``-q``), progress and refusals to stderr; exit 1 if any line
    was refused."""
    published = refused = number = 0
    batch: list[tuple[int, dict[str, Any]]] = []

    async def send() -> None:
        nonlocal published, refused
        outcomes = await client.publish_batch(args.cid, [item for _, item in batch])
        for (line, _), outcome in zip(batch, outcomes, strict=True):
            if "cid" in outcome:
                published += 1
                if args.quiet:
                    print(outcome["cid"], flush=True)
                continue
            refused += 1
            problem = outcome.get("error") or {}
            print(f"pulsarcast: line {line} refused: {problem.get('status')} "
                  f"{problem.get('detail')}", file=sys.stderr)
        batch.clear()
        if not args.quiet:
            print(f"published {published} event(s)", file=sys.stderr, flush=True)

    if args.lines == "-":
        source: TextIO = sys.stdin
    else:
        try:
            source = open(args.lines, encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            print(f"pulsarcast: cannot read {args.lines}: {exc.strerror}", file=sys.stderr)
            return 2
    try:
        for number, text in enumerate(source, start=1):
            text = text.rstrip("\r\n")
            if not text:
                continue
            item: dict[str, Any] = {"payload": text, "key": args.key,
                                    "content_type": args.content_type}
            batch.append((number, item))
            if len(batch) == LINES_BATCH:
                await send()
        if batch:
            await send()
    except UnicodeDecodeError as exc:
        print(f"pulsarcast: line {number + 1} is not UTF-8 ({exc.reason}); "
              f"{published} event(s) were published before it", file=sys.stderr)
        return 2
    finally:
        if source is not sys.stdin:
            source.close()
    if not args.quiet:
        print(f"published {published} event(s) from {number} line(s)"
              + (f", {refused} refused" if refused else ""), flush=True)
    return 1 if refused else 0


async def _publish(client: Any, args: argparse.Namespace) -> int:
    payload: Any
    content_type = args.content_type
    if args.lines is not None:
        return await _publish_lines(client, args)
    if args.text is not None:
        payload = args.text
    elif args.json_payload is not None:
        try:
            value = json.loads(args.json_payload)
        except ValueError as exc:
            print(f"pulsarcast: --json is not JSON: {exc}", file=sys.stderr)
            return 2
        # Compact bytes, exactly as the node encodes a JSON payload; as bytes, a JSON
        # string stays a JSON value ('"hi"') instead of becoming bare text.
        payload = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        content_type = content_type or "application/json"
    else:
        try:
            if args.file == "-":
                payload = sys.stdin.buffer.read()
            else:
                with open(args.file, "rb") as source:
                    payload = source.read()
        except OSError as exc:
            print(f"pulsarcast: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
            return 2
    event = await client.publish(args.cid, payload, parent=args.parent,
                                 content_type=content_type, key=args.key)
    if args.quiet:
        print(event["cid"], flush=True)
    else:
        print(f"published {event['cid']} ({event['payload_size']} bytes)", flush=True)
    return 0


async def _subscribe(client: Any, args: argparse.Namespace) -> int:
    sub = await client.subscribe(args.cid)
    if not args.json:
        print(f"subscribed to {sub['topic']} (log position {sub['position']}); events "
              "print as '#SEQ CID PAYLOAD', resume with --from SEQ", file=sys.stderr,
              flush=True)
    if args.no_follow:
        # What the log holds now, then exit: the history endpoint, which ends by itself.
        start: str = args.start
        if start == "latest":
            return 0
        cursor = None if start == "earliest" else start
        since = None
        if cursor is not None and ("-" in cursor or "." in cursor):
            cursor, since = None, start
        events = client.history(sub["topic"], cursor=cursor, since=since)
    else:
        events = client.live(sub["topic"], from_=args.start)
    async for event in events:
        _emit(args, event, _event_line(event))
    return 0


async def _replay(client: Any, args: argparse.Namespace) -> int:
    count = 0
    tty = sys.stderr.isatty()
    if not args.network:
        # The delivery log exists only for a topic the node follows; for any other topic
        # the history is one network walk away, so take it rather than print nothing.
        followed = {s["topic"] for s in await client.subscriptions()}
        root = (await client.topic_versions(args.cid))[-1]["cid"]
        if root not in followed:
            print(f"this node does not follow {args.cid}: replaying it from the network "
                  "(heads records and the DHT), as --network does", file=sys.stderr)
            args.network = True
    if args.network:
        events = client.replay(args.cid, since=args.since, until=args.until, limit=args.limit)
    else:
        events = client.history_ndjson(args.cid, since=args.since, until=args.until,
                                       limit=args.limit)
    async for event in events:
        sys.stdout.write(json.dumps(event) + "\n")
        count += 1
        if count % 1000 == 0:
            sys.stdout.flush()
            print(f"\rreplayed {count} events" if tty else f"replayed {count} events",
                  end="" if tty else "\n", file=sys.stderr, flush=True)
    sys.stdout.flush()
    if count >= 1000 or tty:
        print(f"{chr(13) if tty else ''}replayed {count} events", file=sys.stderr)
    return 0


async def _peers(client: Any, args: argparse.Namespace) -> int:
    contacts = await client.routing(args.k)
    if args.json:
        for contact in contacts:
            print(json.dumps(contact))
    elif not contacts:
        print("no known peers", file=sys.stderr)
    for contact in [] if args.json else contacts:
        print(f"{contact['peer_id'] or '?':<56} {contact['host']}:{contact['port']:<6} "
              f"kad {contact['kademlia_id'][:16]}")
    return 0


def _consumer_text(info: dict[str, Any]) -> str:
    config = info["config"]
    policy = config["deliver_policy"]
    if isinstance(policy, dict):
        policy = ", ".join(f"{k} {v}" for k, v in policy.items())
    redelivery = (f"backoff {', '.join(f'{s:g}' for s in config['backoff'])} s"
                  if config["backoff"] else f"ack wait {config['ack_wait']:g} s")
    limit = "no limit" if config["max_deliver"] == -1 else f"at most {config['max_deliver']}"
    skipped = info["num_skipped"]
    if info["last_skipped"]:
        first, last = info["last_skipped"]
        skipped = f"{skipped} (retention; last {first}..{last})"
    rows = [
        ("consumer", f"{info['name']} of {info['topic']}"),
        ("deliver", f"{policy}, replay {config['replay_policy']}"),
        ("acks", f"{config['ack_policy']}, {redelivery}, deliveries {limit}, "
                 f"{config['max_ack_pending']} unacknowledged at most"),
        ("delivered", f"up to position {info['delivered']} (started after {info['start']})"),
        ("ack floor", info["ack_floor"]),
        ("pending", f"{info['num_pending']} not delivered yet, {info['num_ack_pending']} "
                    f"unacknowledged ({info['num_redelivered']} redelivered)"),
        ("redeliveries", info["redeliveries"]),
        ("terminated", f"{info['num_terminated']} ({info['num_max_deliver_reached']} after "
                       "max_deliver)"),
        ("skipped", skipped),
    ]
    group = info.get("group")
    if group:
        live = ", ".join(f"{m['name']}@{m['peer'][-8:]}" + (" (me)" if m["me"] else "")
                         for m in group["members"])
        state = "" if group["ready"] else ", joining"
        rows += [
            ("group", f"{group['name']}, {len(group['members'])} member(s) in view "
                      f"{group['epoch']}{state}: {live}"),
            ("watched", f"{group['num_watched']} left to other members; taken over "
                        f"{group['taken_over']}, duplicates {group['duplicates']}"),
        ]
    return "\n".join(f"{k + ':':<14}{v}" for k, v in rows)


async def _consumer_add(client: Any, args: argparse.Namespace) -> int:
    policy: Any = args.deliver
    if args.start_seq is not None:
        policy = {"start_seq": args.start_seq}
    elif args.start_time is not None:
        when: Any = args.start_time
        if re.fullmatch(r"-?[0-9]+(\.[0-9]*)?", when):
            when = float(when)  # seconds; anything else (RFC 3339) the node parses
        policy = {"start_time": when}
    info = await client.add_consumer(
        args.cid, args.name, deliver_policy=policy, ack_policy=args.ack,
        ack_wait=args.ack_wait, max_deliver=args.max_deliver, backoff=args.backoff,
        replay_policy=args.replay, max_ack_pending=args.max_ack_pending, group=args.group)
    _emit(args, info, _consumer_text(info))
    return 0


async def _consumer_info(client: Any, args: argparse.Namespace) -> int:
    info = await client.consumer_info(args.cid, args.name)
    _emit(args, info, _consumer_text(info))
    return 0


async def _consumer_ls(client: Any, args: argparse.Namespace) -> int:
    infos = await client.consumers(args.cid)
    if not infos and not args.json:
        print("no consumers", file=sys.stderr)
    for info in infos:
        _emit(args, info, f"{info['name']:<24} delivered {info['delivered']:<8} "
                          f"ack floor {info['ack_floor']:<8} pending {info['num_pending']:<8} "
                          f"unacknowledged {info['num_ack_pending']}")
    return 0


async def _consumer_rm(client: Any, args: argparse.Namespace) -> int:
    await client.delete_consumer(args.cid, args.name)
    if not args.json:
        print(f"deleted consumer {args.name}", file=sys.stderr)
    return 0


async def _consumer_next(client: Any, args: argparse.Namespace) -> int:
    """Fetch, print and (unless --no-ack) acknowledge the next messages."""
    messages = await client.fetch(args.cid, args.name, batch=args.count, expires=args.wait)
    if not messages:
        print(f"no message within {args.wait:g} s", file=sys.stderr)
        return 0
    for message in messages:
        line = (f"#{message.id} (delivery {message.count}) {message.event['cid']} "
                f"{_payload_text(message.event)}")
        _emit(args, {**message.event, "delivery": {"id": message.id, "count": message.count}},
              line)
    if not args.no_ack:
        await client.ack(args.cid, args.name, [m.id for m in messages])
    return 0


async def _consumer_ack(client: Any, args: argparse.Namespace) -> int:
    kind = args.kind or "ack"
    if args.delay is not None and kind != "nak":
        print("pulsarcast: --delay goes with --nak", file=sys.stderr)
        return 2
    answer = await client.ack(args.cid, args.name, args.ids, kind=kind, delay=args.delay)
    done = " ".join(str(i) for i in answer["done"]) or "-"
    text = f"{kind}: {done}"
    if answer["unknown"]:
        text += f"; not pending: {' '.join(str(i) for i in answer['unknown'])}"
    _emit(args, answer, text)
    return 1 if answer["unknown"] else 0


def _add_consumer_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    consumer = sub.add_parser("consumer", help="durable named consumers of a topic the node "
                              "follows: acknowledgements and redelivery (REST API)")
    commands = consumer.add_subparsers(dest="consumer_command", required=True)

    def named(name: str, text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = commands.add_parser(name, parents=[common],
                                                              help=text)
        parser.add_argument("cid", help="topic CID")
        parser.add_argument("name", help="consumer name (letters, digits, _ and -)")
        return parser

    add = named("add", "make a consumer (again with the same settings: no change)")
    start = add.add_mutually_exclusive_group()
    start.add_argument("--deliver", choices=["all", "last", "new"], default=None,
                       help="where it starts: the oldest event kept (default), the newest, "
                       "only new ones")
    start.add_argument("--start-seq", type=int, default=None, metavar="N",
                       help="start at log position N")
    start.add_argument("--start-time", default=None, metavar="TIME",
                       help="start at the first event delivered at or after TIME (seconds "
                       "since the epoch or RFC 3339)")
    add.add_argument("--ack", choices=["explicit", "all", "none"], default=None,
                     help="ack policy (default explicit)")
    add.add_argument("--ack-wait", type=float, default=None, metavar="SECONDS",
                     help="redeliver what is not acknowledged after this (default 30)")
    add.add_argument("--max-deliver", type=int, default=None, metavar="N",
                     help="set a message aside after N deliveries (default -1: never)")
    add.add_argument("--backoff", type=float, nargs="+", default=None, metavar="SECONDS",
                     help="waits before the 1st, 2nd, ... redelivery, instead of --ack-wait")
    add.add_argument("--replay", choices=["instant", "original"], default=None,
                     help="hand out the backlog at once (default) or at its logged pace")
    add.add_argument("--max-ack-pending", type=int, default=None, metavar="N",
                     help="unacknowledged messages it may hold (default 1000)")
    add.add_argument("--group", default=None, metavar="NAME",
                     help="share the topic's events with the consumers of this group on "
                     "any node (each event is handed out by one member)")
    add.set_defaults(handler=_api_command(_consumer_add))
    named("info", "a consumer's settings, position and counters").set_defaults(
        handler=_api_command(_consumer_info))
    ls = commands.add_parser("ls", parents=[common], help="the consumers of a topic")
    ls.add_argument("cid", help="topic CID")
    ls.set_defaults(handler=_api_command(_consumer_ls))
    named("rm", "delete a consumer").set_defaults(handler=_api_command(_consumer_rm))
    nxt = named("next", "fetch, print and acknowledge the next messages")
    nxt.add_argument("--count", type=int, default=1, help="at most this many (default 1)")
    nxt.add_argument("--wait", type=float, default=5.0, metavar="SECONDS",
                     help="wait this long for the first one (default 5, at most 300)")
    nxt.add_argument("--no-ack", action="store_true",
                     help="do not acknowledge them (they come again after the ack wait)")
    nxt.set_defaults(handler=_api_command(_consumer_next))
    ack = named("ack", "settle delivered messages by id (exit 1 if some were not pending)")
    ack.add_argument("ids", type=int, nargs="+", metavar="ID", help="delivery ids")
    kind = ack.add_mutually_exclusive_group()
    for word, text in (("nak", "deliver them again (now, or after --delay)"),
                       ("term", "never deliver them again"),
                       ("progress", "still working: restart their ack wait")):
        kind.add_argument(f"--{word}", dest="kind", action="store_const", const=word,
                          help=text)
    ack.add_argument("--delay", type=float, default=None, metavar="SECONDS",
                     help="with --nak: wait this long before delivering them again")
    ack.set_defaults(handler=_api_command(_consumer_ack))


def _retention_args(parser: argparse.ArgumentParser) -> None:
    def positive(text: str) -> int:
        value = int(text)
        if value < 1:
            raise argparse.ArgumentTypeError("must be a positive integer")
        return value

    parser.add_argument("--max-age", type=positive, metavar="SECONDS",
                        help="every node keeps only events created in the last SECONDS")
    parser.add_argument("--max-events", type=positive, metavar="N",
                        help="every node keeps only the newest N events")
    parser.add_argument("--compact", action="store_true",
                        help="every node keeps only the newest event of each key "
                             "(publish with --key)")


def _add_api_commands(sub: Any) -> None:
    common = _api_options()
    topic = sub.add_parser("topic", help="create, show or update a topic (REST API)")
    topics = topic.add_subparsers(dest="topic_command", required=True)
    create = topics.add_parser("create", parents=[common], help="create a topic")
    create.add_argument("name")
    create.add_argument("--allowed-publisher", action="append", metavar="PEER",
                        help="only these peers may publish (repeatable; default anyone)")
    create.add_argument("--request-to-publish", action="store_true",
                        help="others may ask the author's node to publish for them")
    create.add_argument("--custom-linking", action="store_true",
                        help="publishers choose each event's parent (--parent)")
    _retention_args(create)
    create.set_defaults(handler=_api_command(_topic_create))
    show = topics.add_parser("show", parents=[common], help="show a topic")
    show.add_argument("cid")
    show.set_defaults(handler=_api_command(_topic_show))
    update = topics.add_parser("update", parents=[common],
                               help="publish a new version of a topic (author's node only)")
    update.add_argument("cid")
    update.add_argument("--name", default=None, help="new name")
    update.add_argument("--allowed-publisher", action="append", metavar="PEER",
                        help="replace who may publish (repeatable)")
    update.add_argument("--anyone", action="store_true", help="let anyone publish again")
    _retention_args(update)
    update.add_argument("--keep-all", action="store_true",
                        help="drop the retention policy: every event is kept again")
    update.set_defaults(handler=_api_command(_topic_update))

    publish = sub.add_parser("publish", parents=[_api_options(output=False)],
                             help="publish an event (REST API)")
    publish.add_argument("cid", help="topic CID")
    payload = publish.add_mutually_exclusive_group(required=True)
    payload.add_argument("--text", help="a UTF-8 text payload")
    payload.add_argument("--json", dest="json_payload", metavar="JSON",
                         help="a JSON value, stored compact")
    payload.add_argument("--file", help="a file's bytes ('-' for stdin)")
    payload.add_argument("--lines", metavar="FILE",
                         help="each line of FILE ('-' for stdin) a text event, published in "
                         "batches of 1,000 (empty lines skipped)")
    publish.add_argument("--content-type", default=None, metavar="TYPE",
                         help="the payload's media type (default: application/json for "
                         "--json, text/plain; charset=utf-8 for --text, none for --file)")
    publish.add_argument("--parent", default=None, help="parent event CID (custom linking)")
    publish.add_argument("--key", default=None,
                         help="the event's key (a compacted topic keeps the newest per key)")
    publish.add_argument("-q", "--quiet", action="store_true",
                         help="print only the new event's CID (for scripts)")
    publish.set_defaults(handler=_api_command(_publish))

    subscribe = sub.add_parser("subscribe", parents=[common],
                               help="subscribe the node and print events as they arrive")
    subscribe.add_argument("cid", help="topic CID")
    subscribe.add_argument("--from", dest="start", default="latest",
                           help="earliest, latest (default), or a seq to print events after "
                           "(resume), an event CID or a time")
    subscribe.add_argument("--no-follow", action="store_true",
                           help="print what the node holds now and exit")
    subscribe.set_defaults(handler=_api_command(_subscribe))

    replay = sub.add_parser("replay", parents=[common],
                            help="a topic's delivered events as NDJSON on stdout")
    replay.add_argument("cid", help="topic CID")
    replay.add_argument("--since", default=None, help="seconds since the epoch or RFC 3339")
    replay.add_argument("--until", default=None, help="seconds since the epoch or RFC 3339")
    replay.add_argument("--limit", type=int, default=None, help="at most this many events")
    replay.add_argument("--network", action="store_true",
                        help="replay from the network (heads records and the DHT), not from "
                        "this node's delivery log: works for a topic the node never followed; "
                        "--since/--until then also take event CIDs and compare times with "
                        "the events' creation")
    replay.set_defaults(handler=_api_command(_replay))

    peers = sub.add_parser("peers", parents=[common], help="the node's routing contacts")
    peers.add_argument("-k", type=int, default=20, help="how many (default 20)")
    peers.set_defaults(handler=_api_command(_peers))

    _add_consumer_commands(sub, common)

    doctor = sub.add_parser("doctor", parents=[common],
                            help="is the node reachable, connected and usable? (REST API)")
    doctor.add_argument("--max-pending", type=int, default=None, metavar="N",
                        help="report a durable consumer with more than N log entries not "
                             "handed out yet as far behind (default 10000)")
    doctor.set_defaults(handler=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    """Exit 0 when nothing failed (warnings allowed), 1 otherwise."""
    from api.client import PulsarcastClient

    from .doctor import DEFAULT_MAX_PENDING, diagnose, render

    max_pending = DEFAULT_MAX_PENDING if args.max_pending is None else args.max_pending

    async def go() -> list[Any]:
        async with PulsarcastClient(args.url, args.token, timeout=10.0) as client:
            return await diagnose(client, args.url, args.token is not None,
                                  max_pending=max_pending)

    findings = run_loop(go())
    if args.json:
        for f in findings:
            print(json.dumps({"verdict": f.verdict, "check": f.what, "detail": f.detail}))
    else:
        print(render(findings), flush=True)
    return 1 if any(f.verdict == "FAIL" for f in findings) else 0


def _testbed(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pulsar.tools.testbed.runner import run_scenario_file

    return run_scenario_file(Path(args.scenario), Path(args.out) if args.out else None,
                             protocols=args.protocol, progress=not args.quiet, netns=args.netns)


def _add_testbed(sub: Any) -> None:
    testbed = sub.add_parser("testbed", help="run a scenario on a real loopback network "
                             "(Pulsarcast and the Floodsub baseline), writing traces")
    commands = testbed.add_subparsers(dest="testbed_command", required=True)
    run = commands.add_parser("run", help="run one scenario file (TOML)")
    run.add_argument("scenario", help="scenario file, e.g. scenarios/baseline.toml")
    run.add_argument("--out", default=None,
                     help="run directory to write (default: runs/<scenario>-<time>)")
    run.add_argument("--protocol", action="append", choices=["pulsarcast", "floodsub"],
                     default=None, help="run only this protocol (repeatable; default: both)")
    run.add_argument("--netns", action="store_true",
                     help="each node in its own network namespace, the scenario's latency, "
                     "loss and partitions made by the kernel, bytes on the wire from its "
                     "interface counters (root; docs/testbed.md)")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.set_defaults(handler=_testbed)


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pulsar.tools.testbed.report import run_report

    try:
        summary_path = run_report([Path(d) for d in args.run_dirs],
                                  Path(args.out) if args.out else None, master=args.master)
    except ValueError as exc:
        print(f"pulsarcast report: {exc}", file=sys.stderr)
        return 2
    print(summary_path)
    return 0


def _verify(args: argparse.Namespace) -> int:
    import json
    import time
    from pathlib import Path

    from pulsar.tools.verify.runner import run_verify
    from pulsar.tools.verify.scenario import ScenarioError, load_scenario

    try:
        scenario = load_scenario(args.scenario).with_(
            seed=args.seed, nodes=args.nodes, duration=args.duration)
    except ScenarioError as exc:
        print(f"pulsarcast verify: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("runs") / (
        f"verify-{scenario.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        outcome = run_loop(run_verify(scenario, out, quiet=args.quiet))
    except RuntimeError as exc:
        print(f"pulsarcast verify: {exc}", file=sys.stderr)
        return 2
    print(f"report: {out / 'report.md'}", file=sys.stderr)
    print(json.dumps(outcome.summary))
    return 0 if outcome.summary["ok"] else 1


def _add_verify(sub: Any) -> None:
    verify = sub.add_parser(
        "verify", help="check the guarantees from outside: real nodes in network namespaces, "
        "faults made by the kernel and the OS, a client history and a checker (root)")
    verify.add_argument("scenario", nargs="?", default=None,
                        help="scenario file (TOML, docs/verification.md; default: built in)")
    verify.add_argument("--seed", type=int, default=None, help="fault and workload seed")
    verify.add_argument("--nodes", type=int, default=None, help="node processes (>= 5)")
    verify.add_argument("--duration", type=float, default=None,
                        help="seconds of workload under faults")
    verify.add_argument("--out", default=None,
                        help="run directory (default: runs/verify-<seed>-<time>)")
    verify.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    verify.set_defaults(handler=_verify)


def _add_report(sub: Any) -> None:
    report = sub.add_parser("report", help="QoS report of testbed runs, computed with PySpark "
                            "(Markdown, PNG plots, JSON summary)")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="testbed run directory")
    report.add_argument("--out", default=None,
                        help="where to write the report (default: RUN_DIR/report for one run, "
                        "else ./report)")
    report.add_argument("--master", default="local[*]",
                        help="Spark master URL (default local[*])")
    report.set_defaults(handler=_report)


def _range_ms(text: str) -> tuple[float, float]:
    try:
        lo_text, _, hi_text = text.partition("-")
        lo = float(lo_text)
        hi = float(hi_text) if hi_text else lo
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LO-HI in milliseconds") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= LO <= HI")
    return lo, hi


def _sim(args: argparse.Namespace) -> int:
    from pulsar.tools.sim.scenarios import SimOptions, run_sim

    try:
        options = SimOptions(
            nodes=args.nodes, scenario=args.scenario, protocol=args.protocol, seed=args.seed,
            topics=args.topics, events=args.events, latency_ms=args.latency_ms,
            loss=args.loss, churn=args.churn, restart=args.restart,
            partition=args.partition, late=args.late, interval=args.interval,
            bucket_size=args.bucket_size, replicas=args.replicas,
            settle_max=args.settle_max, progress=not args.quiet,
        )
    except ValueError as exc:
        print(f"pulsarcast sim: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(run_sim(options)), flush=True)
    return 0


def _add_sim(sub: Any) -> None:
    from pulsar.tools.sim.scenarios import SCENARIOS

    sim = sub.add_parser(
        "sim", help="simulate a network of protocol cores (up to 10,000s of nodes) and print "
        "one JSON line of figures")
    sim.add_argument("--nodes", type=int, default=100, help="network size (default 100)")
    sim.add_argument("--scenario", choices=SCENARIOS, default="single",
                     help="who publishes and what goes wrong (default single)")
    sim.add_argument("--protocol", choices=["pulsarcast", "floodsub"], default="pulsarcast")
    sim.add_argument("--seed", type=int, default=1)
    sim.add_argument("--topics", type=int, default=1)
    sim.add_argument("--events", type=int, default=100,
                     help="rounds of publishing; one event each (all: one per node)")
    sim.add_argument("--interval", type=float, default=0.1,
                     help="simulated seconds between rounds (default 0.1)")
    sim.add_argument("--latency-ms", type=_range_ms, default=(10.0, 100.0), metavar="LO-HI",
                     help="one-way link latency, fixed per link, uniform in LO-HI ms "
                     "(default 10-100)")
    sim.add_argument("--loss", type=float, default=0.0,
                     help="share of messages lost while publishing (default 0)")
    sim.add_argument("--churn", type=float, default=0.0,
                     help="share of nodes that crash while publishing (churn: 0.3)")
    sim.add_argument("--restart", action=argparse.BooleanOptionalAction, default=True,
                     help="crashed nodes come back after 1-5 s from their durable state "
                     "(default; --no-restart: they stay down)")
    sim.add_argument("--partition", type=float, default=0.0,
                     help="share of nodes cut off for part of the run (partition: 0.2)")
    sim.add_argument("--late", type=float, default=0.0,
                     help="share of nodes that subscribe after publishing "
                     "(late-subscriber: 0.1)")
    sim.add_argument("--bucket-size", type=int, default=20,
                     help="Kademlia k: peers per routing-table bucket (default 20)")
    sim.add_argument("--replicas", type=int, default=8,
                     help="DHT replicas per value (default 8, as the node)")
    sim.add_argument("--settle-max", type=float, default=120.0,
                     help="simulated seconds to wait after publishing (default 120)")
    sim.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    sim.set_defaults(handler=_sim)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pulsarcast",
        description="Decentralised, persistent publish-subscribe over a Kademlia DHT.",
    )
    parser.add_argument(
        "--loop", choices=LOOPS, default=None,
        help=f"event loop of this command and the processes it starts (default uvloop when "
             f"installed; also ${LOOP_ENV})")
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench(sub)
    _add_devnet(sub)
    _add_node(sub)
    _add_api_commands(sub)
    _add_testbed(sub)
    _add_report(sub)
    _add_sim(sub)
    _add_verify(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.loop is not None:
        os.environ[LOOP_ENV] = args.loop  # inherited by the processes it starts
    try:
        result: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
