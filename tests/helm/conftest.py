"""Fixtures of the chart tests: a helm binary (fails, never skips, when there is none) and
``render``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helm.chart import find_helm, render_chart


@pytest.fixture(scope="session")
def helm() -> str:
    found = find_helm()
    if found is None:
        pytest.fail(
            "helm not found (.venv/bin/helm or PATH): `make test` installs it, or run "
            "`.venv/bin/python tests/helm/fetch_helm.py .venv/bin/helm`",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="session")
def render(helm: str) -> Any:
    """``render(files=(...), sets=(...))`` → the rendered manifests (dicts)."""

    def _call(files: tuple[str, ...] = (), sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        return list(render_chart(helm, tuple(str(f) for f in files), tuple(sets)))

    return _call
