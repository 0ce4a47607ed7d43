"""The package's import structure, read from the source (every import statement, those inside
functions and ``TYPE_CHECKING`` blocks too, with ``ast``): no module imports itself through
others, and the low levels never reach up into the layers built on them."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
#: Modules the rest builds on; none of them may import a module of :data:`HIGH`.
LOW = ("sparkstate.spark", "sparkstate.fs", "sparkstate.paths", "sparkstate.types", "sparkstate.group_state",
       "sparkstate.errors", "sparkstate.durations", "sparkstate.io",
       "sparkstate.jvm_archive", "sparkstate.engines", "sparkstate.compile", "sparkstate.operators")
#: The layers on top: a job, a pipeline, the command line, the demo.
HIGH = ("sparkstate.jobs", "sparkstate.pipelines", "sparkstate.cli", "sparkstate.demo")


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted((SRC / "sparkstate").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def _targets(node: ast.AST, module: str, package: bool, modules: dict) -> list[str]:
    """The sparkstate modules one import statement names (``from pkg import name`` names the
    module ``pkg.name`` when there is one, else ``pkg``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = module.split(".") if package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
    found = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name.startswith("sparkstate") and name != module:
            found.append(name)
    return found


@lru_cache(maxsize=1)
def import_graph() -> dict[str, set[str]]:
    """module -> the sparkstate modules it imports, anywhere in its source."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, (path, package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[module] = {t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                         for t in _targets(node, module, package, modules)}
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module, as one loop through it (a path
    that comes back to its start), found by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle(graph, g) for g in groups]


def _cycle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:  # breadth first inside the group, back to the start
        v = todo.pop(0)
        for w in sorted(graph[v] & group):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return sorted(group)


def _within(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def test_the_reader_sees_the_import_statements():
    graph = import_graph()
    assert "sparkstate.engines.base" in graph["sparkstate.compile"]
    assert "sparkstate.spark" in graph["sparkstate.compile"]
    # an import inside a function counts
    assert "sparkstate.jvm_archive" in graph["sparkstate.spark"]
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_module_imports_itself_through_others():
    found = loops(import_graph())
    assert not found, "import loops (imports inside functions count):\n" + "\n".join(" -> ".join(c) for c in found)


def test_low_levels_import_no_layer_above_them():
    graph = import_graph()
    up = sorted(f"{m} -> {t}" for m, ts in graph.items() if _within(m, LOW) for t in ts if _within(t, HIGH))
    assert not up, "low-level modules importing a job, pipeline, the CLI or the demo:\n" + "\n".join(up)
