"""The runtime room's shape, counted from its source (docs/design.md "Layout").

Not a timing: the numbers a reader of ``cluster/`` pays for, read from the imports and the
definitions of its non-test Python, so a change that grows them shows in the same JSON the
benchmarks print.

- ``lines``, ``files``: physical lines and ``.py`` files under ``cluster/``;
- ``any``: uses of the name ``Any`` (the tokenizer's NAME tokens, the imports included, as a
  reader meets them); ``type_ignores``: ``# type: ignore`` comments;
- ``cycles``: import cycles between modules, every import outside ``if TYPE_CHECKING:``
  counted, lazy ones inside functions too (the strongly connected components of more than one
  module); ``typing_cycles``: those that close only through type-checking imports;
- ``back_up``: imports from a layer to a higher one, in the order of :data:`LAYERS` (a module
  may import its own layer and those below it).

Targets (issue [22]): ``any`` ≤ 80, no cycles, no imports back up.

    .venv/bin/python -m bench.layout [--root PATH] [--quiet]
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: bench/ must not shadow the project's packages
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.common import add_output_flags, at_most, emit, verdict

ROOT = Path(__file__).resolve().parents[1]
ANY_MAX = 80

# Low to high. A module's layer is the first prefix (dotted, under ``cluster``) that names it;
# what no prefix names is ``base``: the contracts and utilities every layer may use.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ()),
    ("dataplane", ("dataplane",)),
    ("sim", ("sim",)),
    ("ray", ("ray",)),
    ("serve", ("serve",)),
    ("backends", ("backends",)),
    ("service", ("service", "config", "app_builder")),
)


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (dotted, ``cluster.…``)."""
    rest = module.split(".")[1:]
    for index, (_, prefixes) in enumerate(LAYERS):
        if rest and rest[0] in prefixes:
            return index
    return 0


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[tuple[str, bool]]:
    """``(module, under TYPE_CHECKING)`` for every absolute import in ``tree``; a ``from X
    import Y`` yields ``X.Y`` too, which resolves when ``Y`` is a module."""

    def walk(node: ast.AST, typing: bool) -> Iterator[tuple[str, bool]]:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from walk(child, True)
            for child in node.orelse:
                yield from walk(child, typing)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, typing
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, typing
            for alias in node.names:
                yield f"{node.module}.{alias.name}", typing
        for inner in ast.iter_child_nodes(node):
            yield from walk(inner, typing)

    yield from walk(tree, False)


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Run-time and type-checking edges between the modules of ``cluster``."""
    files = sorted((root / "cluster").rglob("*.py"))
    modules = {_module_name(p, root): p for p in files}
    runtime: dict[str, set[str]] = {m: set() for m in modules}
    typing: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for target, under_typing in _imports(ast.parse(path.read_text(), str(path))):
            if target in modules and target != module and not target.endswith("__init__"):
                (typing if under_typing else runtime)[module].add(target)
    for module in modules:  # a package's __init__ is not a dependency of its own modules
        runtime[module].discard(module.rsplit(".", 1)[0])
    return runtime, typing


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def back_up_imports(edges: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every run-time import from a lower layer to a higher one."""
    return sorted(
        f"{a} -> {b}" for a, targets in edges.items() for b in targets if layer_of(b) > layer_of(a)
    )


def _counts(text: str) -> tuple[int, int]:
    names = ignores = 0
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME and token.string == "Any":
            names += 1
        elif token.type == tokenize.COMMENT and "type: ignore" in token.string:
            ignores += 1
    return names, ignores


def measure(root: Path) -> dict[str, Any]:
    files = sorted((root / "cluster").rglob("*.py"))
    texts = [p.read_text() for p in files]
    counts = [_counts(t) for t in texts]
    runtime, typing = import_graph(root)
    both = {m: runtime[m] | typing[m] for m in runtime}
    run_cycles = cycles(runtime)
    return {
        "lines": sum(t.count("\n") for t in texts),
        "files": len(files),
        "any": sum(c[0] for c in counts),
        "type_ignores": sum(c[1] for c in counts),
        "cycles": run_cycles,
        "typing_cycles": [c for c in cycles(both) if c not in run_cycles],
        "back_up": back_up_imports(runtime),
        "layers": [name for name, _ in LAYERS],
    }


def judge(report: dict[str, Any]) -> dict[str, Any]:
    return verdict(
        {
            "any": at_most(report["any"], ANY_MAX),
            "cycles": at_most(len(report["cycles"]) + len(report["typing_cycles"]), 0),
            "back_up": at_most(len(report["back_up"]), 0),
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the project's folder")
    add_output_flags(parser)
    args = parser.parse_args(argv)
    report = measure(args.root)
    return emit("layout", judge(report), report, args.quiet)


if __name__ == "__main__":
    sys.exit(main())
