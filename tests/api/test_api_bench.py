"""``pulsarcast bench api`` runs end to end on a small log and reports every figure."""

from __future__ import annotations

import pytest

from pulsar.tools.bench.api import bench_api


@pytest.mark.slow
async def test_bench_api_reports_positive_figures() -> None:
    figures = await bench_api(events=300, publish_requests=100, concurrency=4)
    for name in ("publish_req_per_s", "embedded_publish_per_s", "publish_vs_embedded",
                 "sse_events_per_s", "history_ndjson_events_per_s", "log_entries_per_s",
                 "sse_vs_direct", "ndjson_vs_direct"):
        assert figures[name] > 0, name
    assert figures["events"] >= 300 and figures["publish_concurrency"] == 4
