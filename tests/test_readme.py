"""The README's Python examples run as written and print what the README says."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```\n\nIt prints `(.*?)`\n", README.read_text(), re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize(
    ("code", "expected"), BLOCKS, ids=[f"example{i}" for i in range(len(BLOCKS))]
)
def test_readme_example_runs(code: str, expected: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


TOUR = re.search(r"## Five minutes over HTTP\n.*?```sh\n(.*?)```\n", README.read_text(), re.S)


@pytest.mark.skipif(shutil.which("curl") is None, reason="the tour is written for curl")
def test_readme_curl_tour_runs_against_a_devnet(tmp_path: Path) -> None:
    """The README's HTTP tour, run as written against ``pulsarcast devnet`` (ports are
    whatever was free here, so the tour's 8701/8702 are pointed at them)."""
    assert TOUR is not None
    devnet = subprocess.Popen(
        [sys.executable, "-m", "pulsar.tools.cli", "devnet", "--nodes", "3", "--json",
         "--data-dir", "data/devnet"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert devnet.stdout is not None
        urls = [json.loads(devnet.stdout.readline())["url"] for _ in range(3)]
        script = TOUR.group(1).replace("http://127.0.0.1:8701", urls[0])
        script = script.replace("http://127.0.0.1:8702", urls[1])
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
    finally:
        devnet.send_signal(signal.SIGINT)
        try:
            code = devnet.wait(timeout=30)
        except subprocess.TimeoutExpired:
            devnet.kill()
            raise
        finally:
            if devnet.stdout is not None:
                devnet.stdout.close()
    assert code == 0, "the devnet did not stop cleanly on SIGINT"
    out = done.stdout
    topic = json.loads(out.splitlines()[0])
    assert topic["name"] == "deploys"
    assert f'{{"topic": "{topic["cid"]}", "position": 0}}' in out
    # payloads come back as they were published (and always as base64 too)
    assert '"text": "rollback of 1.4.1 done"' in out
    assert '"json": {"service": "api", "version": "1.4.2"}' in out
    assert "cm9sbGJhY2sgb2YgMS40LjEgZG9uZQ==" in out
    assert list(tmp_path.iterdir()) == [tmp_path / "data"]  # no scratch files left behind
    # the stream, on node 1, delivered both events in order with positions 1 and 2
    assert re.search(r"id: 1\nevent: event\ndata: .*\n\nid: 2\nevent: event\n", out)
    assert '"next_cursor": "1"' in out
    assert json.loads(out.splitlines()[-1])["status"] == 401
