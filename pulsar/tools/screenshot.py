"""A screenshot of the node's web page for the docs: ``make screenshot``, or
``python -m pulsar.tools.screenshot docs/web-page.png``.

It starts a small local network (four nodes in a temporary directory), makes two topics
on node 0 with subscribers, publishes some events, keeps a trickle of live ones going so
the rates show something, and opens the page of node 2, a subscriber of both (so its trees
have parents, and RTTs to them), where two durable consumers of one topic have read some of
it. It publishes one event from the page's own form and saves a full-page PNG taken by
headless Chromium (:mod:`pulsar.tools.browser`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
from pathlib import Path

from api.server import ApiServer
from dag import CID
from pulsar import Node

from .browser import launch, missing
from .devnet import Devnet

__all__ = ["take"]

WIDTH = 1280
SHOWN = 2
"""The node whose page is shown: it follows both topics and is the root of neither."""
WAIT_MS = 60_000


async def _trickle(node: Node, topic: CID, stop: asyncio.Event) -> None:
    """A live reading every 0.4 s until ``stop``, so deliveries per second are not zero."""
    reading = 0
    while not stop.is_set():
        reading += 1
        payload = json.dumps({"sensor": "hall", "celsius": 20 + reading % 5 / 10})
        await node.publish(topic, payload.encode())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.4)


async def _populate(nodes: list[Node]) -> tuple[CID, CID]:
    deploys = await nodes[0].create_topic("deploys")
    sensors = await nodes[0].create_topic("sensors/temperature")
    for node in nodes[1:]:
        await node.subscribe(deploys.cid)
    await nodes[2].subscribe(sensors.cid)
    for version in ("1.4.1", "1.4.2", "1.4.3"):
        await nodes[0].publish(deploys.cid, f"api {version} deployed".encode())
    await nodes[1].publish(deploys.cid, b"worker 2.0.0 deployed")
    # Two applications reading the deploys at the shown node: one settled two, the other
    # holds three it has not acknowledged yet.
    shown = nodes[SHOWN]
    deadline = asyncio.get_running_loop().time() + WAIT_MS / 1000
    while shown.last_position(deploys.cid) < 4:
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"node {SHOWN} did not log the four deploys")
        await shown.wait_for_log(deploys.cid, shown.last_position(deploys.cid), 5.0)
    await shown.consumers.add(deploys.cid, {"name": "billing", "ack_policy": "all"})
    taken = await shown.consumers.fetch(deploys.cid, "billing", 2)
    await shown.consumers.ack(deploys.cid, "billing", [taken[-1].id])
    await shown.consumers.add(deploys.cid, {"name": "audit", "ack_wait": 600,
                                            "max_deliver": 5})
    await shown.consumers.fetch(deploys.cid, "audit", 3)
    return deploys.cid, sensors.cid


async def take(out: Path) -> None:
    """Run the network, open the page, save the screenshot to ``out``."""
    from playwright.async_api import async_playwright, expect

    with tempfile.TemporaryDirectory(prefix="pulsarcast-screenshot-") as tmp:
        net = Devnet(Path(tmp), 4)
        server = None
        stop = asyncio.Event()
        try:
            nodes = await net.start()
            server = await ApiServer.start(nodes[SHOWN])
            deploys, sensors = await _populate(nodes)
            trickle = asyncio.create_task(_trickle(nodes[0], sensors, stop))
            async with async_playwright() as playwright:
                browser = await launch(playwright)
                try:
                    page = await browser.new_page(viewport={"width": WIDTH, "height": 900})
                    await page.goto(server.url + "/")
                    await page.locator("#live-topic").select_option(str(deploys),
                                                                    timeout=WAIT_MS)
                    await page.locator("#token").fill(server.token)
                    await page.locator("#publish-topic").select_option(str(deploys))
                    await page.locator("#publish-payload").fill("web 3.1.0 deployed")
                    await page.locator("#publish-form button").click()
                    await expect(page.locator("#publish-result")).to_contain_text(
                        "published", timeout=WAIT_MS)
                    await expect(page.locator("#event-rows tr")).to_have_count(
                        5, timeout=WAIT_MS)
                    await page.locator("#consumer-topic").select_option(str(deploys))
                    await expect(page.locator("#consumer-rows tr")).to_have_count(
                        2, timeout=WAIT_MS)
                    # Each of the four trees has its parent measured.
                    measured = page.locator('.tree dd[data-role="parents"] .rtt', has_text="ms")
                    await expect(measured).to_have_count(4, timeout=WAIT_MS)
                    rate = page.locator('[data-metric="deliveries/s"] .value')
                    await expect(rate).not_to_have_text("—", timeout=WAIT_MS)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    await page.screenshot(path=str(out), full_page=True)
                finally:
                    await browser.close()
            stop.set()
            await trickle
        finally:
            stop.set()
            if server is not None:
                await server.stop()
            await net.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pulsar.tools.screenshot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default="docs/web-page.png",
                        help="where to save the PNG (default docs/web-page.png)")
    args = parser.parse_args(argv)
    reason = missing()
    if reason is not None:
        print(f"cannot take the screenshot: {reason}", file=sys.stderr)
        return 1
    asyncio.run(take(Path(args.out)))
    print(f"saved {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
