"""The rooms' boundaries (docs/design.md "Layout"): the math rooms are plain Python, the metrics
room is plain ``prometheus_client``, and only ``cluster/`` and ``disaggctl/`` touch Ray, NATS or
HTTP. Checked on the imports each module states, so a boundary crossed anywhere fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MATH_ROOMS = ("auction", "router", "games", "controller")
# Runtimes and transports: what the math rooms and the metrics room must never import.
RUNTIME = {"ray", "nats", "httpx", "fastapi", "uvicorn", "starlette", "aiohttp", "requests"}
ADAPTERS = {"cluster", "disaggctl", "bench"}


def _imports(path: Path) -> set[str]:
    """The top-level package of every module ``path`` imports (absolute imports only)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _modules(room: str) -> list[Path]:
    return sorted((ROOT / room).rglob("*.py"))


@pytest.mark.parametrize("room", MATH_ROOMS)
def test_a_math_room_imports_no_runtime_and_no_adapter(room: str) -> None:
    modules = _modules(room)
    assert modules, room
    crossed = {
        str(p.relative_to(ROOT)): sorted(_imports(p) & (RUNTIME | ADAPTERS | {"prometheus_client"}))
        for p in modules
    }
    assert {p: names for p, names in crossed.items() if names} == {}


def test_the_metrics_room_is_prometheus_client_alone() -> None:
    for path in _modules("telemetry"):
        imported = _imports(path) - {"__future__", "logging", "telemetry", "typing"}
        assert imported <= {"prometheus_client"}, (path, imported)


def test_cluster_has_no_import_cycle_and_no_import_back_up() -> None:
    """docs/design.md "Layout": inside ``cluster/`` a module imports its own layer and those
    below it (``bench.layout.LAYERS``), and no two modules import each other, at run time or
    for the type checker."""
    from bench.layout import measure

    shape = measure(ROOT)
    assert shape["cycles"] == [] and shape["typing_cycles"] == []
    assert shape["back_up"] == []


def test_a_back_up_import_and_a_cycle_are_seen(tmp_path: Path) -> None:
    from bench.layout import measure

    (tmp_path / "cluster" / "ray").mkdir(parents=True)
    (tmp_path / "cluster" / "backends").mkdir()
    (tmp_path / "cluster" / "__init__.py").write_text("")
    (tmp_path / "cluster" / "ray" / "__init__.py").write_text("")
    (tmp_path / "cluster" / "backends" / "__init__.py").write_text("")
    (tmp_path / "cluster" / "ray" / "a.py").write_text("def f():\n    import cluster.backends.b\n")
    (tmp_path / "cluster" / "backends" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cluster.ray import a\n"
    )
    shape = measure(tmp_path)
    assert shape["back_up"] == ["cluster.ray.a -> cluster.backends.b"]
    assert shape["cycles"] == [] and shape["typing_cycles"] == [
        ["cluster.backends.b", "cluster.ray.a"]
    ]
    assert shape["files"] == 5 and shape["any"] == 0
