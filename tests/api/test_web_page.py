"""The node's web page in a real browser: headless Chromium (the system's, ``apt-get install
chromium``) driven by Playwright, against real nodes and their APIs on loopback.

Marked ``browser``: ``pytest -m browser`` runs just these. Without Chromium or Playwright
they are skipped with a reason that says how to install them; nothing else is skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from api import ApiServer
from api.page import CSP
from dag import TopicDescriptor
from pulsar.tools.browser import launch, missing
from pulsar.tools.spark.background import ServedNode
from tests.node.conftest import Network

MISSING = missing()
pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

WAIT_MS = 30_000
"""How long the page may take to show something (the machine may be busy)."""


@dataclass
class Site(ServedNode):
    """The node whose page is open, with its API; a test may restart both on the same port
    and data directory (what an operator's restart looks like to an open page)."""

    net: Network


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    net = Network(tmp_path)
    nodes = await net.start(3)
    site = Site(nodes[0], await ApiServer.start(nodes[0], heartbeat=0.2), net)
    try:
        yield site
    finally:
        await site.server.stop()
        await net.close()


@pytest.fixture
async def page(site: Site) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await launch(playwright)
        try:
            tab = await browser.new_page()
            errors: list[str] = []
            tab.on("pageerror", lambda error: errors.append(str(error)))
            yield tab
            assert errors == [], errors  # no script error in the page
        finally:
            await browser.close()


async def _topic(site: Site, name: str) -> TopicDescriptor:
    """A topic authored by the site's node, which is subscribed to it."""
    topic = await site.node.create_topic(name)
    await site.node.subscribe(topic.cid)
    return topic


def _rows(page: Any) -> Any:
    return page.locator("#event-rows tr")


async def _seqs(page: Any) -> list[int]:
    return [int(s) for s in await page.locator("#event-rows tr").evaluate_all(
        "rows => rows.map(r => r.dataset.seq)")]


async def test_page_shows_the_node_and_live_events_and_publishes_with_a_token(
        site: Site, page: Any) -> None:
    from playwright.async_api import expect

    topic = await _topic(site, "weather")
    await site.node.publish(topic.cid, b"before the page")
    # A name off the network is text, never markup.
    markup = await _topic(site, "<img src=x id=injected>")
    other = await site.net.nodes[1].create_topic("elsewhere")

    async with aiohttp.ClientSession() as http, http.get(site.url + "/") as answer:
        assert answer.status == 200 and answer.headers["Content-Security-Policy"] == CSP

    await page.goto(site.url + "/")
    await expect(page.locator("#peer-id")).to_have_text(str(site.node.peer_id), timeout=WAIT_MS)
    await expect(page.locator("#status")).to_have_attribute("data-state", "live")
    row = page.locator(f'#topic-rows tr[data-topic="{topic.cid}"]')
    await expect(row.locator(".topic-name")).to_have_text("weather", timeout=WAIT_MS)
    await expect(page.locator(f'#topic-rows tr[data-topic="{markup.cid}"] .topic-name')
                 ).to_have_text("<img src=x id=injected>")
    assert await page.locator("#injected").count() == 0
    await expect(page.locator(f'#tree-cards .tree[data-topic="{topic.cid}"]')).to_be_visible()

    # The live view follows the first subscription: recent history, then live over SSE.
    await page.locator("#live-topic").select_option(str(topic.cid))
    await expect(_rows(page).filter(has_text="before the page")).to_have_count(1, timeout=WAIT_MS)
    await expect(page.locator("#live-status")).to_have_text("live", timeout=WAIT_MS)
    await site.node.publish(topic.cid, b"live one")
    await expect(_rows(page).first).to_contain_text("live one", timeout=WAIT_MS)

    # Publishing without a token shows the API's refusal; with it, the event goes out.
    await page.locator("#publish-topic").select_option(str(topic.cid))
    await page.locator("#publish-payload").fill("from the page")
    await page.locator("#publish-form button").click()
    result = page.locator("#publish-result")
    await expect(result).to_contain_text("401 A valid bearer token is required", timeout=WAIT_MS)
    await expect(result).to_have_attribute("data-state", "error")
    assert site.node.last_position(topic.cid) == 2

    await page.locator("#token").fill(site.token)
    await page.locator("#publish-form button").click()
    await expect(result).to_contain_text("published bafy", timeout=WAIT_MS)
    await expect(_rows(page).first).to_contain_text("from the page", timeout=WAIT_MS)
    entry = site.node.log_entries(topic.cid, after=2, limit=1)[0]
    assert await site.node.payload_of(entry.event) == b"from the page"

    # Subscribing from the page (token still in the page) joins the other node's topic.
    await page.locator("#subscribe-cid").fill(str(other.cid))
    await page.locator("#subscribe-form button").click()
    await expect(page.locator("#subscribe-result")).to_contain_text("subscribed to",
                                                                    timeout=WAIT_MS)
    assert other.cid in site.node.subscribed()
    await expect(page.locator(f'#topic-rows tr[data-topic="{other.cid}"] .topic-name')
                 ).to_have_text("elsewhere", timeout=WAIT_MS)
    assert await _seqs(page) == [3, 2, 1]
    # The token was never written anywhere the browser keeps.
    stored = await page.evaluate("() => JSON.stringify([{...localStorage}, {...sessionStorage},"
                                 " document.cookie])")
    assert site.token not in stored


async def test_page_keeps_working_when_the_node_restarts(site: Site, page: Any) -> None:
    from playwright.async_api import expect

    topic = await _topic(site, "deploys")
    await site.node.publish(topic.cid, b"one")
    await page.goto(site.url + "/")
    await expect(_rows(page).filter(has_text="one")).to_have_count(1, timeout=WAIT_MS)
    await expect(page.locator("#live-status")).to_have_text("live", timeout=WAIT_MS)
    await site.node.publish(topic.cid, b"two")
    await expect(_rows(page).first).to_contain_text("two", timeout=WAIT_MS)

    port = int(site.url.rsplit(":", 1)[1])
    await site.server.stop()
    await expect(page.locator("#status")).to_have_attribute("data-state", "down",
                                                           timeout=WAIT_MS)
    site.node = await site.net.restart(site.node)
    # Published by the restarted node before the page is back: the stream resumes after
    # the last event it showed, so these arrive once each, in order.
    for text in (b"three", b"four"):
        await site.node.publish(topic.cid, text)
    site.server = await ApiServer.start(site.node, port=port, heartbeat=0.2)

    await expect(page.locator("#status")).to_contain_text("node restarted", timeout=WAIT_MS)
    await expect(_rows(page).first).to_contain_text("four", timeout=WAIT_MS)
    await site.node.publish(topic.cid, b"five")
    await expect(_rows(page).first).to_contain_text("five", timeout=WAIT_MS)
    assert await _seqs(page) == [5, 4, 3, 2, 1]
    payloads = await page.locator("#event-rows td.payload").all_inner_texts()
    assert payloads == ["five", "four", "three", "two", "one"]


async def test_page_shows_a_topics_consumers_and_adds_and_deletes_one(
        site: Site, page: Any) -> None:
    from playwright.async_api import expect

    topic = await _topic(site, "orders")
    for i in range(3):
        await site.node.publish(topic.cid, b"order %d" % i)
    consumers = site.node.consumers
    await consumers.add(topic.cid, {"name": "billing", "ack_wait": 30, "max_ack_pending": 2})
    await consumers.add(topic.cid, {"name": "poison", "ack_wait": 0.2, "max_deliver": 1})
    await page.goto(site.url + "/")
    await page.locator("#consumer-topic").select_option(str(topic.cid))
    billing = page.locator('#consumer-rows tr[data-consumer="billing"]')
    await expect(billing.locator('[data-field="num_pending"]')).to_have_text("3",
                                                                             timeout=WAIT_MS)
    await expect(billing.locator('[data-field="policies"]')).to_have_text(
        "all · ack explicit, wait 30 s")

    # The counters follow the node's: two handed out fill max_ack_pending (marked), one of
    # them acknowledged; a message past max_deliver is set aside (marked).
    await consumers.fetch(topic.cid, "billing", 2)
    full = billing.locator('[data-field="num_ack_pending"]')
    await expect(full).to_have_text("2 / 2", timeout=WAIT_MS)
    await expect(full).to_have_attribute("data-state", "warn")
    await consumers.ack(topic.cid, "billing", [1])
    await expect(billing.locator('[data-field="ack_floor"]')).to_have_text("1", timeout=WAIT_MS)
    for field, shown in (("delivered", "2"), ("num_pending", "1"), ("num_ack_pending", "1 / 2"),
                         ("num_redelivered", "0"), ("terminated", "0 · 0"),
                         ("num_skipped", "0")):
        await expect(billing.locator(f'[data-field="{field}"]')).to_have_text(shown)
    assert await full.get_attribute("data-state") is None
    await consumers.fetch(topic.cid, "poison", 1)
    aside = page.locator('#consumer-rows tr[data-consumer="poison"] [data-field="terminated"]')
    await expect(aside).to_have_text("1 · 1", timeout=WAIT_MS)  # once its ack_wait is over
    await expect(aside).to_have_attribute("data-state", "warn")

    # Adding one needs the token, as every change does.
    await page.locator("#consumer-name").fill("audit")
    await page.locator("#consumer-ack").select_option("all")
    await page.locator("#consumer-max-deliver").fill("5")
    await page.locator("#consumer-form button").click()
    result = page.locator("#consumer-result")
    await expect(result).to_contain_text("401 A valid bearer token is required", timeout=WAIT_MS)
    assert [c.name for c in await consumers.list(topic.cid)] == ["billing", "poison"]
    await page.locator("#token").fill(site.token)
    await page.locator("#consumer-form button").click()
    await expect(result).to_contain_text("added consumer audit", timeout=WAIT_MS)
    audit = page.locator('#consumer-rows tr[data-consumer="audit"]')
    await expect(audit.locator('[data-field="policies"]')).to_have_text(
        "all · ack all, wait 30 s, max 5 deliveries", timeout=WAIT_MS)
    made = await consumers.info(topic.cid, "audit")
    assert (made.config.ack_policy, made.config.max_deliver, made.num_pending) == ("all", 5, 3)

    # Deleting asks once more, then the consumer is gone from the node and the page.
    delete = audit.locator('[data-action="delete"]')
    await delete.click()
    await expect(delete).to_have_text("really delete?")
    assert "audit" in [c.name for c in await consumers.list(topic.cid)]
    await delete.click()
    await expect(result).to_contain_text("deleted consumer audit", timeout=WAIT_MS)
    await expect(audit).to_have_count(0)
    assert [c.name for c in await consumers.list(topic.cid)] == ["billing", "poison"]

    # A member of a group: the row names the group and the members this node sees.
    await page.locator("#consumer-name").fill("worker")
    await page.locator("#consumer-ack").select_option("explicit")
    await page.locator("#consumer-max-deliver").fill("")
    await page.locator("#consumer-group").fill("crew")
    await page.locator("#consumer-form button").click()
    await expect(result).to_contain_text("added consumer worker", timeout=WAIT_MS)
    worker = page.locator('#consumer-rows tr[data-consumer="worker"] [data-field="group"]')
    await expect(worker).to_contain_text("crew · 1 members", timeout=WAIT_MS)
    assert (await consumers.info(topic.cid, "worker")).config.group == "crew"
    billing_group = billing.locator('[data-field="group"]')
    await expect(billing_group).to_have_text("—")
