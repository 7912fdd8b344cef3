"""The headline and the thesis table from hand-made summaries: no Spark, every figure set
here, so what the text claims can be checked against what it was given."""

from __future__ import annotations

from typing import Any

import pytest

from pulsar.tools.testbed.report_headline import TIMES, headline_facts, headline_sentence
from pulsar.tools.testbed.report_thesis import THESIS, thesis_rows


def _metrics(ratio: float, coverage: float, p50: float, p99: float, pubsub: int, dht: int,
             tail: dict[str, int] | None = None) -> dict[str, Any]:
    return {"delivery_ratio": ratio, "subscription_coverage": coverage,
            "latency_s": {"p50": p50, "p99": p99},
            "bytes": {"pubsub_total": pubsub, "dht_total": dht, "total": pubsub + dht},
            "first_copy": {"by_via": {}, "tail_by_via": tail or {}, "tail_from_s": p99}}


def _run(name: str, tail: dict[str, int] | None) -> dict[str, Any]:
    pulsarcast = _metrics(1.0, 1.0, 0.015, 5.5, 300, 1400, tail)
    floodsub = _metrics(0.725, 0.5, 0.010, 0.040, 900, 100)
    return {"name": name, "protocols": {"pulsarcast": pulsarcast, "floodsub": floodsub},
            "comparison": {"numerator": "floodsub", "denominator": "pulsarcast",
                           "ratios": {"bytes_total": 1000 / 1700}}}


def test_the_headline_names_repairs_only_when_most_of_the_tail_came_by_them() -> None:
    facts = headline_facts(_run("churn", {"blocks": 40, "dht": 20, "event": 20}))
    assert facts is not None
    text = headline_sentence("churn", facts).replace(TIMES, "x")
    assert text == (
        "**churn**: Pulsarcast delivered 100.00 % of expected pairs vs Floodsub's 72.50 %; "
        "cost: 1.70x Floodsub's bytes sent (pub-sub 0.33x, DHT 14.00x); latency of delivered "
        "pairs p50 15 ms, p99 5.50 s (Floodsub 10 ms / 40 ms) — the p99 is from repairs: 60 "
        "of the 80 slowest pairs (75.00 %) got their first copy by WANT/BLOCKS or a DHT "
        "fetch.")
    mostly_tree = headline_facts(_run("churn", {"blocks": 30, "event": 50}))
    assert mostly_tree is not None and not mostly_tree["tail"]["from_repair"]
    assert headline_sentence("churn", mostly_tree).endswith(
        "— 30 of the 80 slowest pairs came by repair, the rest by the tree.")


def test_no_cause_is_claimed_without_route_records() -> None:
    facts = headline_facts(_run("baseline", None))
    assert facts is not None and facts["tail"]["repair_share"] is None
    assert headline_sentence("baseline", facts).endswith("(Floodsub 10 ms / 40 ms).")


def test_no_headline_without_pulsarcast() -> None:
    run = _run("baseline", None)
    del run["protocols"]["pulsarcast"]
    assert headline_facts(run) is None


def test_thesis_rows_put_its_table_beside_ours() -> None:
    rows = thesis_rows({"b": _run("baseline", None), "c": _run("churn", None)})
    assert [row[0] for row in rows] == ["`b`"] * 3  # the thesis ran no churn
    assert rows[0][2:] == ["100.00 % · 100.00 %", "99.99 % · 99.99 % (Pulsarcast)"]
    assert rows[1][2] == "72.50 % · 50.00 %"
    # Table 5.8: 6,552.4 MiB for Floodsub against 2,237.74 for Pulsarcast
    assert THESIS["baseline"].floodsub_mib / THESIS["baseline"].pulsarcast_mib == \
        pytest.approx(2.928, abs=1e-3)
    ours, thesis = (cell.replace(TIMES, "x") for cell in rows[2][2:])
    assert ours == "0.59x" and thesis == "2.93x (6,552 / 2,238 MiB)"


def test_the_setup_note_says_when_the_kernel_made_the_faults() -> None:
    from pulsar.tools.testbed.report_markdown import _thesis_section
    from pulsar.tools.testbed.report_thesis import NETNS_DIFFERENCE

    loopback = "\n".join(_thesis_section({"b": _run("baseline", None)}))
    assert NETNS_DIFFERENCE not in loopback
    netns = "\n".join(_thesis_section({"b": {**_run("baseline", None), "network": "netns"}}))
    assert NETNS_DIFFERENCE in netns
