"""``pulsarcast doctor``: is a node reachable, connected and usable, and if not, why.

A new user's first failures are rarely in the protocol: the node is not running, listens
elsewhere, has no peers because no seed was given, or the token is missing or stale. Each
check prints one line (``ok``, ``warn`` or ``FAIL``) naming the fix, so the answer is
readable without knowing the API. It talks to the node through the light HTTP client only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Finding", "diagnose", "render"]

Verdict = Literal["ok", "warn", "FAIL"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's outcome: ``what`` was looked at, ``detail`` what was seen or the fix."""

    verdict: Verdict
    what: str
    detail: str


async def diagnose(client: Any, url: str, token_given: bool) -> list[Finding]:
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
