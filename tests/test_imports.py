"""What a light import loads, in a fresh interpreter: the HTTP client and the modules a
Spark executor imports must not bring in the node, the DHT or kademlia (import-linter
checks the static imports; this checks what actually runs, lazy exports included)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pulsar.node", "pulsar.net", "pulsar.proto", "api.server", "dht", "kademlia")


def _loaded(module: str) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return list(json.loads(out))


@pytest.mark.parametrize(
    "module", ["api.client", "pulsar.tools.spark", "pulsar.tools.spark.source"]
)
def test_light_imports_do_not_load_the_node(module: str) -> None:
    loaded = _loaded(module)
    assert module in loaded
    heavy = [m for m in loaded if m in HEAVY or m.startswith(tuple(h + "." for h in HEAVY))]
    assert heavy == []


def test_the_lazy_exports_still_work() -> None:
    import api
    import pulsar

    assert pulsar.Node.__module__ == "pulsar.node"
    assert api.ApiServer.__module__ == "api.server"
    assert set(pulsar.__all__) <= set(dir(pulsar))
    with pytest.raises(AttributeError):
        _ = pulsar.NoSuchThing  # type: ignore[attr-defined]
