"""The experiments' tests share the project's one Ray session per test session: the fixture of
tests/integration/conftest.py (lazy; torn down at the end; it joins a Ray already running in
this process instead of starting a second)."""

from __future__ import annotations

from tests.integration.conftest import ray_session

__all__ = ["ray_session"]
