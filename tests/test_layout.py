"""Module sizes the layout promises (docs/architecture.md, CONTRIBUTING.md).

A library module that outgrows 600 lines has stopped having one job, and the node facade
over 400 lines has started deciding protocol matters again. The tools under
``pulsar/tools`` (CLI, benchmarks, simulator, testbed) are not the library and are not
held to it.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("dag", "dht", "api", "pulsar")
TOOLS = ROOT / "pulsar" / "tools"
MODULE_LIMIT = 600
FACADE = ROOT / "pulsar" / "node.py"
FACADE_LIMIT = 400


def _lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def library_modules() -> list[Path]:
    found = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            if TOOLS in path.parents:
                continue
            found.append(path)
    return found


def oversized(paths: list[Path], limit: int, root: Path = ROOT) -> list[str]:
    return [f"{p.relative_to(root)}: {n} lines" for p in paths if (n := _lines(p)) > limit]


def test_the_check_sees_the_library() -> None:
    modules = library_modules()
    names = {p.relative_to(ROOT).as_posix() for p in modules}
    assert {"pulsar/proto/core.py", "dag/store.py", "dht/node.py", "api/server.py"} <= names
    assert not any(n.startswith("pulsar/tools/") for n in names)


def test_the_check_flags_a_long_module(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MODULE_LIMIT + 1))
    short = tmp_path / "short.py"
    short.write_text("x = 1\n" * MODULE_LIMIT)
    expected = [f"long.py: {MODULE_LIMIT + 1} lines"]
    assert oversized([long, short], MODULE_LIMIT, tmp_path) == expected


def test_no_library_module_over_the_limit() -> None:
    assert oversized(library_modules(), MODULE_LIMIT) == []


def test_the_node_facade_stays_thin() -> None:
    assert _lines(FACADE) <= FACADE_LIMIT, f"pulsar/node.py: {_lines(FACADE)} lines"
