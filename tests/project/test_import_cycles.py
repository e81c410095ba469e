"""No import circle among the dmlrepro modules (docs/architecture.md: every module imports only
modules below it).

Static, from the AST of every module under src/dmlrepro: an import anywhere in a module (at module
level or inside a function) is an edge to the imported module and to the packages it lies in
(Python runs a package's __init__ before its submodules), except to the importer's own packages
(already being imported when the importer runs). `python tests/project/test_import_cycles.py` prints
the circles.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "dmlrepro"


def module_names(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its __init__)."""
    names = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement asks for (``from a import b`` asks for a and a.b)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: from the importer's package, one level up per extra dot
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the in-package modules its imports run (module-level and function-level alike)."""
    names = module_names(src)
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(node, name, path.name == "__init__.py"):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):  # the module and every package it lies in
                    prefix = ".".join(parts[:i])
                    if prefix in names and prefix != name and prefix not in own:
                        graph[name].add(prefix)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_no_import_cycles():
    cycles = import_cycles(import_graph())
    assert not cycles, "import circles among dmlrepro modules:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_detector_finds_a_function_level_circle(tmp_path):
    """The detector itself: a circle closed by an import inside a function, and one through a
    package's __init__, are found; a submodule importing its own package is not a circle."""
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from dmlrepro.b import f\n")
    (package / "b.py").write_text("def f():\n    from . import a\n")
    (package / "sub" / "__init__.py").write_text("from .inner import g\n")
    (package / "sub" / "inner.py").write_text("from dmlrepro.sub import other\nimport dmlrepro.c\n")
    (package / "sub" / "other.py").write_text("")
    (package / "c.py").write_text("def h():\n    import dmlrepro.sub.other\n")
    assert import_cycles(import_graph(tmp_path)) == [
        ["dmlrepro.a", "dmlrepro.b"],
        ["dmlrepro.c", "dmlrepro.sub", "dmlrepro.sub.inner"],
    ]


if __name__ == "__main__":
    found = import_cycles(import_graph())
    for cycle in found:
        print(" <-> ".join(cycle))
    print(f"{len(found)} import circle(s)")
    sys.exit(1 if found else 0)
