"""What the web page reads besides the long-standing endpoints: the page and its files,
the trees with repair links and RTTs, and the counters as JSON. Plain HTTP, no browser
(that is tests/api/test_web_page.py)."""

from __future__ import annotations

import fnmatch
import time
import tomllib
from importlib import resources
from pathlib import Path

from api.page import ASSETS, CSP
from tests.waiting import eventually

from .conftest import Api

ROOT = Path(__file__).resolve().parents[2]


async def test_page_and_its_files_are_served_without_a_token(apis: list[Api]) -> None:
    api = apis[0]
    async with api.http.get(f"{api.url}/") as r:
        page = await r.text()
        assert r.status == 200 and r.content_type == "text/html"
        assert r.headers["Content-Security-Policy"] == CSP
        assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'self'" in CSP and "'unsafe-inline'" not in CSP
    for name, content_type in ASSETS.items():
        assert f"/static/{name}" in page
        async with api.http.get(f"{api.url}/static/{name}") as r:
            assert r.status == 200 and r.content_type == content_type
            assert r.headers["Content-Security-Policy"] == CSP
    # Only the listed files: no path reaches the disk.
    for path in ("/static/index.html", "/static/..%2Fauth.py", "/static/%2e%2e/page.py",
                 "/static/nothing.js"):
        status, problem = await api.call("GET", path, auth=False)
        assert status == 404 and problem["type"].endswith("/not-found"), path  # type: ignore[index]


def test_the_page_files_ship_with_the_package() -> None:
    """Every file in api/static is matched by the package data of pyproject.toml, so an
    installed (not editable) node serves its page too."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["api"]
    files = [f.name for f in resources.files("api").joinpath("static").iterdir()]
    assert sorted(files) == sorted(["index.html", *ASSETS])
    for name in files:
        assert any(fnmatch.fnmatch(f"static/{name}", p) for p in patterns), name


async def test_trees_name_repair_links_and_neighbours_rtts(apis: list[Api]) -> None:
    author, first, second = apis
    _, topic = await author.call("POST", "/v1/topics", json={"name": "measured"})
    cid = topic["cid"]
    for reader in (first, second):
        await reader.call("PUT", f"/v1/subscriptions/{cid}")

    async def measured() -> bool:
        # RTTs are probed with traffic: keep publishing until the tree is measured.
        await author.call("POST", f"/v1/topics/{cid}/events", json={"text": "ping"})
        _, trees = await author.call("GET", "/v1/node/trees")
        tree = next(t for t in trees["trees"] if t["topic"] == cid)  # type: ignore[index]
        children = tree["children"]
        return bool(children) and all(tree["rtt"][child] for child in children)

    await eventually(measured, timeout=20, interval=0.2, what="RTTs of the tree's children")
    for api in apis:
        _, trees = await api.call("GET", "/v1/node/trees")
        for tree in trees["trees"]:  # type: ignore[index]
            neighbours = {*tree["parents"], *tree["children"], *tree["lazy"], *tree["grafted"]}
            assert set(tree["rtt"]) == neighbours
            assert isinstance(tree["attached"], bool)
            for sample in tree["rtt"].values():
                assert sample is None or 0 < sample["srtt_ms"] <= sample["rto_ms"]
    _, trees = await author.call("GET", "/v1/node/trees")
    tree = next(t for t in trees["trees"] if t["topic"] == cid)  # type: ignore[index]
    assert tree["is_root"] and tree["subscribed"] and tree["parents"] == []


async def test_metrics_as_json_agree_with_the_prometheus_text(apis: list[Api]) -> None:
    api, reader = apis[0], apis[1]
    _, topic = await api.call("POST", "/v1/topics", json={"name": "counted"})
    await reader.call("PUT", f"/v1/subscriptions/{topic['cid']}")
    await api.call("POST", f"/v1/topics/{topic['cid']}/events", json={"text": "x"})

    async def delivered() -> bool:
        _, metrics = await reader.call("GET", "/v1/node/metrics", auth=False)
        return metrics["node"]["delivered"] == 1  # type: ignore[index]

    await eventually(delivered, timeout=10, what="the event at the reader")
    before = time.time()
    status, metrics = await api.call("GET", "/v1/node/metrics", auth=False)
    assert status == 200 and isinstance(metrics, dict)
    assert abs(metrics["at"] - before) < 5 and metrics["uptime_s"] >= 0
    assert metrics["node"]["published"] == 1 and metrics["subscriptions"] == 1
    assert metrics["transport"]["bytes_sent"] > 0 and "bytes_sent" in metrics["dht"]
    _, text = await api.call("GET", "/metrics", auth=False)
    sent = metrics["transport"]["bytes_sent"]
    line = next(ln for ln in str(text).splitlines()
                if ln.startswith("pulsarcast_transport_bytes_sent_total "))
    assert int(line.split()[1]) >= sent
    assert "pulsarcast_published_total 1" in str(text)
