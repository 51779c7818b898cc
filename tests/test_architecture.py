"""The house rules ARCHITECTURE.md states, read from the code with `ast`: imports only go down
the declared layers, no import circle, no bare ValueError/RuntimeError, no file over 350 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("compressor", "pruners", "mergers")

# The layer order, bottom first: a module may import its own layer and the ones below it. Groups
# in one layer never import each other (the run machinery reaches the plugin packages only by
# name, through the registry). `compressor/__init__.py` and `__main__.py` are the facade on top.
LAYERS: list[tuple[str, ...]] = [
    ("compressor.core",),
    ("compressor.families",),
    ("compressor.data",),
    ("compressor.uq",),
    ("compressor.surgery",),
    ("compressor.plugins",),
    ("compressor.training",),
    ("compressor.deploy",),
    ("compressor.run", "pruners", "mergers"),
    ("compressor", "compressor.__main__"),
]


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for f in (ROOT / package).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = f
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its file (lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def place(name: str) -> tuple[int, str]:
    """(layer index, group) of a module: the longest declared prefix that contains it."""
    best = None
    for i, layer in enumerate(LAYERS):
        for group in layer:
            if (name == group or name.startswith(group + ".")) and (best is None or len(group) > len(best[1])):
                best = (i, group)
    assert best is not None, f"{name} is in no declared layer"
    return best


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_imports_only_go_down_the_layers():
    wrong = []
    for name, deps in graph().items():
        layer, group = place(name)
        for dep in deps:
            dep_layer, dep_group = place(dep)
            if dep_layer > layer or (dep_layer == layer and dep_group != group):
                wrong.append(f"{name} -> {dep}")
    assert not wrong, "imports going up (or across) the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_circle():
    edges = graph()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for v in edges:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_layer_checks_catch_an_upward_import_and_a_circle():
    """The two checks above can fail: an edge from core to run is upward, a back edge is a circle."""
    assert place("compressor.core.errors")[0] < place("compressor.run.runner")[0]
    assert place("pruners.topk")[1] != place("compressor.run.cli")[1]
    assert place("compressor.data.text") == (2, "compressor.data")


def test_no_bare_value_or_runtime_errors_and_no_long_files():
    bare, long = [], []
    for path in modules().values():
        text = path.read_text()
        if len(text.splitlines()) > 350:
            long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Raise) and node.exc is not None:
                call = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(call, ast.Name) and call.id in ("ValueError", "RuntimeError"):
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    for folder in ("tests", "benchmarks"):  # the rule on length holds for every Python file
        for path in (ROOT / folder).rglob("*.py"):
            if len(path.read_text().splitlines()) > 350:
                long.append(f"{path.relative_to(ROOT)}: {len(path.read_text().splitlines())} lines")
    assert not bare, "raise a CompressorError subclass instead: " + ", ".join(bare)
    assert not long, "files over 350 lines: " + ", ".join(long)
