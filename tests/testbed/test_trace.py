"""The trace writer: what a crash may cost a trace, and what it must not."""

from __future__ import annotations

import json
from pathlib import Path

from pulsar.tools.testbed.trace import TraceWriter


def test_a_restarted_nodes_trace_does_not_glue_onto_a_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "node-0.jsonl"
    path.write_text('{"t":1.0,"node":0,"kind":"deliver"}\n{"t":2.0,"node":0,"ki')  # killed
    writer = TraceWriter(path, 0)
    writer.write("publish", topic="bafy", event="bafz", parent=None, bytes=3)
    lines = path.read_text().splitlines()  # written at once: publishes are flushed
    writer.close()
    assert lines[1] == '{"t":2.0,"node":0,"ki'
    assert json.loads(lines[2])["kind"] == "publish"
