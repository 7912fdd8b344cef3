"""No import cycles between the modules of our packages (``dag``, ``dht``, ``pulsar``, ``api``).

The graph is built statically: every ``.py`` file under the four packages is parsed with
:mod:`ast` and each ``import``/``from ... import`` it contains (at any depth, function-local
imports included: they run too, and must not hide a cycle) becomes an edge to a module of
our packages. Imports of anything else (the standard library, third parties) are ignored.

The rules follow import-linter (grimp), which checks our layer contracts with
``exclude_type_checking_imports = true``, so both tools see the same graph:

* ``import a.b.c`` is an import of ``a.b.c``; the parent packages ``a`` and ``a.b`` that
  Python runs first are *not* edges (otherwise every ``from .x import y`` in a package's
  ``__init__`` would form a cycle with any submodule importing a sibling absolutely).
* ``from pkg import name`` is an import of ``pkg.name`` if that is a module, else of
  ``pkg``; ``from pkg import *`` is an import of ``pkg``. Relative imports are resolved
  against the importing module's package (a package's ``__init__`` is that package).
* A module name that is not one of ours but starts with one of our packages (``pkg.Name``
  where ``Name`` is a class) resolves to its longest prefix that is a module.
* Package ``__init__`` modules are modules like any other: their imports count.
* Imports under ``if TYPE_CHECKING:`` (or ``if typing.TYPE_CHECKING:``) are skipped — they
  never run, so they cannot make a cycle at runtime. The ``else:`` branch of such an ``if``
  does run, and counts.

The test finds the strongly connected components of the graph (Tarjan's algorithm, written
iteratively) and fails on any with more than one module (or a module importing itself),
printing the members, one concrete cycle and the import lines that make it.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dag", "dht", "pulsar", "api")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    file: str
    line: int


def _module_name(root: Path, path: Path) -> tuple[str, bool]:
    """The dotted name of the module in ``path`` and whether it is a package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _modules(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    found: dict[str, tuple[Path, bool]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            name, is_package = _module_name(root, path)
            found[name] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING" and isinstance(test.value, ast.Name) \
            and test.value.id == "typing"
    return False


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree`` except those under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _ours(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    """The longest prefix of ``name`` that is one of our modules, or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             modules: dict[str, tuple[Path, bool]]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            target = _ours(alias.name, modules)
            if target is not None:
                yield target
        return
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        if node.level - 1 > len(package):
            raise AssertionError(f"relative import beyond the top package in {module}")
        base_parts = package[: len(package) - (node.level - 1)]
        if node.module:
            base_parts = [*base_parts, *node.module.split(".")]
        base = ".".join(base_parts)
    else:
        base = node.module or ""
    for alias in node.names:
        if alias.name != "*" and f"{base}.{alias.name}" in modules:
            yield f"{base}.{alias.name}"
            continue
        target = _ours(base, modules)
        if target is not None:
            yield target


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES
                 ) -> dict[str, list[Edge]]:
    """Each module of ``packages`` (directories in ``root``) and its runtime imports of
    modules of ``packages``."""
    modules = _modules(root, packages)
    graph: dict[str, list[Edge]] = {name: [] for name in modules}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _runtime_imports(tree):
            for target in _targets(node, name, is_package, modules):
                graph[name].append(Edge(name, target, str(path.relative_to(root)), node.lineno))
    return graph


def strongly_connected(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Tarjan's strongly connected components, without recursion."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, iter(sorted({e.target for e in graph[start]}))))
        while work:
            node, successors = work[-1]
            descended = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted({e.target for e in graph[succ]}))))
                    descended = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _a_cycle(graph: dict[str, list[Edge]], component: list[str]) -> list[Edge]:
    """One shortest cycle through the first module of ``component``, as import edges."""
    members = set(component)
    start = component[0]
    came_from: dict[str, Edge] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for edge in graph[node]:
            if edge.target not in members:
                continue
            if edge.target == start:
                path = [edge]
                while path[0].source != start:
                    path.insert(0, came_from[path[0].source])
                return path
            if edge.target not in came_from:
                came_from[edge.target] = edge
                queue.append(edge.target)
    raise AssertionError(f"no cycle through {start}")


def _describe(graph: dict[str, list[Edge]], component: list[str]) -> str:
    cycle = _a_cycle(graph, component)
    lines = [f"cycle among {len(component)} modules: {', '.join(component)}",
             "  e.g. " + " -> ".join([cycle[0].source, *(e.target for e in cycle)])]
    lines += [f"    {e.file}:{e.line} imports {e.target}" for e in cycle]
    return "\n".join(lines)


def cycles(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """The components with more than one module, or one that imports itself."""
    return [c for c in strongly_connected(graph)
            if len(c) > 1 or any(e.target == c[0] for e in graph[c[0]])]


def test_the_rules_on_a_small_tree(tmp_path: Path) -> None:
    files = {
        "top/__init__.py": "from .a import A\nfrom . import b\n",
        "top/a.py": "from typing import TYPE_CHECKING\nimport json\n"
                    "if TYPE_CHECKING:\n    from .b import B\nelse:\n    import top.c\n"
                    "class A: ...\n",
        "top/b.py": "from top.a import A\nfrom top import a\nB = A\n",
        "top/c.py": "from .sub import d\n",
        "top/sub/__init__.py": "",
        "top/sub/d.py": "def f() -> None:\n    from ..c import __name__\n",
        "other/__init__.py": "import typing\nif typing.TYPE_CHECKING:\n    import top.sub.d\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("top", "other"))
    edges = {m: sorted({e.target for e in es}) for m, es in graph.items()}
    assert edges == {
        "top": ["top.a", "top.b"],
        "top.a": ["top.c"],  # not top.b: only when type checking
        "top.b": ["top.a"],
        "top.c": ["top.sub.d"],
        "top.sub": [],
        "top.sub.d": ["top.c"],  # a function-local import counts
        "other": [],
    }
    assert cycles(graph) == [["top.c", "top.sub.d"]]
    assert "top/sub/d.py:2 imports top.c" in _describe(graph, ["top.c", "top.sub.d"])


def test_the_graph_sees_our_modules() -> None:
    graph = import_graph()
    assert {"dag", "dht", "api", "pulsar", "pulsar.node", "pulsar.proto.core"} <= set(graph)
    core = {e.target for e in graph["pulsar.proto.core"]}
    assert {"dag", "pulsar.proto.config", "pulsar.proto.tree.routing"} <= core


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    report = "\n".join(_describe(graph, c) for c in found)
    assert not found, f"{len(found)} import cycle(s) between our modules:\n{report}"
