"""Run a benchmark's ``main`` in-process and read back its JSON report."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from typing import Any

import pytest


def bench_report(main: Callable[[list[str]], int], argv: list[str]) -> dict[str, Any]:
    """The report ``main(argv)`` prints: strict JSON (a NaN fails the test), its exit status
    agreeing with its ``met``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    parsed: dict[str, Any] = json.loads(out.getvalue(), parse_constant=pytest.fail)
    assert status == (0 if parsed["met"] else 1)
    return parsed
