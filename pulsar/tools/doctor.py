"""``pulsarcast doctor``: is a node reachable, connected and usable, and if not, why.

A new user's first failures are rarely in the protocol: the node is not running, listens
elsewhere, has no peers because no seed was given, or the token is missing or stale. Each
check prints one line (``ok``, ``warn`` or ``FAIL``) naming the fix, so the answer is
readable without knowing the API. It talks to the node through the light HTTP client only.

The durable consumers of the followed topics are looked at too: how many each topic has,
and a line for every consumer an operator should look at (messages set aside after
``max_deliver``, as many unacknowledged as ``max_ack_pending`` allows, positions skipped
because retention cut them, a backlog past ``--max-pending``). Those are warnings: the node
works, an application on it does not keep up or keeps failing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["DEFAULT_MAX_PENDING", "Finding", "consumer_problems", "diagnose", "render"]

Verdict = Literal["ok", "warn", "FAIL"]

DEFAULT_MAX_PENDING: Final = 10_000
"""A consumer with more log entries than this not handed out yet is reported as far
behind (``pulsarcast doctor --max-pending``)."""
TOPIC_LINES: Final = 20
"""Topics listed with their consumers, at most; the summary counts them all."""
_CONCURRENCY: Final = 8
"""Topics whose consumers are asked for at a time."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's outcome: ``what`` was looked at, ``detail`` what was seen or the fix."""

    verdict: Verdict
    what: str
    detail: str


async def diagnose(client: Any, url: str, token_given: bool, *,
                   max_pending: int = DEFAULT_MAX_PENDING) -> list[Finding]:
    """Run the checks in order; stops after the first that makes the rest meaningless
    (an unreachable node). ``client`` is an :class:`api.client.PulsarcastClient`."""
    import aiohttp

    from api.client import ApiError

    found: list[Finding] = []
    try:
        health = await client.health()
    except aiohttp.ClientConnectorError as exc:
        reason = exc.os_error.strerror or str(exc.os_error)
        return [Finding("FAIL", "reachable", f"no answer from {url}: {reason}. Is the node "
                        "running? `make run` starts five on ports 8701-8705; a node of "
                        "your own takes --api-port; point here with --url or "
                        "PULSARCAST_URL")]
    except ApiError as exc:
        return [Finding("FAIL", "reachable", f"{url} answered {exc.status} {exc.kind}: "
                        f"{exc.detail}")]
    except (aiohttp.ClientError, TimeoutError) as exc:
        return [Finding("FAIL", "reachable", f"{url}: {exc or type(exc).__name__}; is "
                        "this a pulsarcast node's API?")]
    node = await client.node()
    found.append(Finding("ok", "reachable", f"{url}: node {node['peer_id']}, up "
                         f"{health['uptime_s']:.0f} s, pub-sub and DHT on "
                         f"{node['address']['host']}:{node['address']['port']}"))
    found.append(await _peers(client))
    found.append(await _trees(client, health["subscriptions"]))
    found += await _consumers(client, ApiError, max_pending)
    found.append(await _token(client, token_given, ApiError))
    return found


async def _peers(client: Any) -> Finding:
    contacts = await client.routing()
    if not contacts:
        return Finding("FAIL", "peers", "the DHT routing table is empty: the node knows no "
                       "other node, so it can neither store nor find anything. Start it "
                       "with --bootstrap HOST:PORT of a running node (make run's nodes "
                       "do this for you)")
    verified = sum(1 for c in contacts if c["peer_id"] is not None)
    detail = f"{len(contacts)} DHT contact(s), {verified} with a verified peer id"
    if verified == 0:
        return Finding("warn", "peers", detail + ": none answered with its identity yet; "
                       "if this lasts, check that their TCP ports are reachable")
    return Finding("ok", "peers", detail)


async def _trees(client: Any, subscriptions: int) -> Finding:
    trees = await client.trees()
    orphans = [t["topic"] for t in trees
               if t["subscribed"] and not t["is_root"] and not t["parents"]]
    detail = f"{subscriptions} subscription(s), {len(trees)} tree(s)"
    if orphans:
        return Finding("warn", "trees", f"{detail}; {len(orphans)} subscribed topic(s) have "
                       f"no parent in their tree yet (joining or repairing), e.g. "
                       f"{orphans[0]}")
    return Finding("ok", "trees", detail)


async def _consumers(client: Any, api_error: type[Exception], max_pending: int
                     ) -> list[Finding]:
    """How many consumers each followed topic has, and the consumers with a problem."""
    topics = [s["topic"] for s in await client.subscriptions()]
    gate = asyncio.Semaphore(_CONCURRENCY)
    unread: list[Finding] = []

    async def of(topic: str) -> list[dict[str, Any]]:
        async with gate:
            try:
                return list(await client.consumers(topic))
            except api_error as exc:
                kind = getattr(exc, "kind", None)
                if kind == "not-found":  # no such route: a node from before consumers
                    raise
                if kind != "not-subscribed":  # that one: unsubscribed since the list
                    unread.append(Finding("warn", "consumers", f"could not read the "
                                          f"consumers of {topic}: {exc}"))
                return []

    try:
        found = await asyncio.gather(*(of(t) for t in topics))
    except api_error:
        return [Finding("warn", "consumers", "this node's API has no durable consumers "
                        "(GET /v1/topics/{cid}/consumers is not found: an older version)")]
    per_topic = [(topic, infos) for topic, infos in zip(topics, found, strict=True) if infos]
    total = sum(len(infos) for _, infos in per_topic)
    if total == 0:
        return [Finding("ok", "consumers", f"none on the {len(topics)} followed topic(s)"),
                *unread]
    troubled = [(topic, info, problems) for topic, infos in per_topic for info in infos
                if (problems := consumer_problems(info, max_pending))]
    summary = (f"{total} on {len(per_topic)} of {len(topics)} followed topic(s)"
               + (f"; {len(troubled)} to look at (below)" if troubled else ""))
    lines = [Finding("warn" if troubled else "ok", "consumers", summary)]
    for topic, infos in per_topic[:TOPIC_LINES]:
        listed = ", ".join(f"{i['name']} ({i['num_pending']:,} pending, "
                           f"{i['num_ack_pending']:,} unacknowledged{_group_note(i)})"
                           for i in infos)
        lines.append(Finding("ok", "consumers", f"{topic}: {listed}"))
    if len(per_topic) > TOPIC_LINES:
        lines.append(Finding("ok", "consumers", f"... and {len(per_topic) - TOPIC_LINES} "
                             "more topic(s) with consumers"))
    lines += [Finding("warn", "consumers", f"{info['name']} of {topic}: {'; '.join(problems)}")
              for topic, info, problems in troubled]
    return lines + unread


def consumer_problems(info: dict[str, Any], max_pending: int = DEFAULT_MAX_PENDING
                      ) -> list[str]:
    """What an operator should know of a consumer (its info as the API answers it), each
    with what to do; empty when it is well."""
    config = info["config"]
    problems = []
    set_aside = info["num_max_deliver_reached"]
    if set_aside:
        problems.append(
            f"{set_aside:,} message(s) set aside after max_deliver ({config['max_deliver']}) "
            "deliveries: its application keeps failing on them; the node's log names each "
            "('set aside after'), and they are not delivered again")
    if info["num_ack_pending"] >= config["max_ack_pending"]:
        problems.append(
            f"{info['num_ack_pending']:,} unacknowledged, its max_ack_pending: it hands out "
            "nothing more until some are acknowledged; is its application acknowledging "
            "(or gone)? Messages come again after ack_wait "
            f"({config['ack_wait']:g} s)")
    if info["num_skipped"]:
        last = info.get("last_skipped")
        where = f" (last {last[0]}-{last[1]})" if last else ""
        problems.append(
            f"skipped {info['num_skipped']:,} log position(s){where} the topic's retention "
            "cut before it read them: it reads slower than retention keeps events")
    if info["num_pending"] > max_pending:
        problems.append(
            f"far behind: {info['num_pending']:,} log entries not handed out yet (more "
            f"than {max_pending:,}); its application reads slower than the topic grows, or "
            "stopped")
    group = info.get("group")
    if group and group["ready"] and len(group["members"]) == 1:
        problems.append(
            f"alone in group {group['name']}: no other member heard for 3 s, so it hands "
            "out every event; are the other members' nodes up and following the topic?")
    if group and group["duplicates"]:
        problems.append(
            f"{group['duplicates']:,} event(s) of group {group['name']} also handled by "
            "another member since its node started: members died, restarted or did not "
            "hear each other (a partition)")
    return problems


def _group_note(info: dict[str, Any]) -> str:
    group = info.get("group")
    if not group:
        return ""
    return (f"; group {group['name']} of {len(group['members'])}, "
            f"{group['num_watched']:,} watched, {group['taken_over']:,} taken over")


async def _token(client: Any, token_given: bool, api_error: type[Exception]) -> Finding:
    if not token_given:
        return Finding("warn", "token", "none given: reads work, changes (create, subscribe, "
                       "publish) will be refused. Pass --token or set PULSARCAST_TOKEN (the "
                       "node writes it to <data-dir>/api-token)")
    try:
        await client.check_token()
    except api_error as exc:
        if getattr(exc, "status", None) == 401:
            return Finding("FAIL", "token", "the node refuses this token; read it again from "
                           "<data-dir>/api-token of that node (each node has its own)")
        raise
    return Finding("ok", "token", "accepted for changes")


def render(findings: list[Finding]) -> str:
    return "\n".join(f"{f.verdict:<4} {f.what:<9} {f.detail}" for f in findings)
