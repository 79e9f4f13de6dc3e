"""The pareto report's sentence on the prefix-cache hit rate (disaggctl/experiment/pareto.py:
describe_cache): the panel's range, and how far ω alone and τ alone move it."""

from __future__ import annotations

from typing import Any

from disaggctl.experiment.pareto import WORKLOAD
from disaggctl.experiment.pareto_prose import describe_cache


def _cell(tau: float, omega: float, hit: float | None) -> dict[str, Any]:
    return {"concurrency": 64, "view": "fresh", "tau": tau, "omega": omega, "cache_hit_rate": hit}


def test_the_sentence_gives_the_range_and_the_widest_move_along_each_axis() -> None:
    cells = [_cell(0.0, 0.0, 0.70), _cell(0.0, 1.0, 0.83), _cell(2.0, 0.0, 0.71),
             _cell(2.0, 1.0, 0.72), _cell(0.8, 1.0, None)]  # fmt: skip
    text = describe_cache({"cells": cells})
    assert f"one would hit {WORKLOAD.ideal_hit_rate():.3f};" in text
    assert "C = 64, fresh: 0.700 at (0, 0) to 0.830 at (0, 1)" in text
    assert "ω alone moves it by up to 0.130 (at τ = 0)" in text
    assert "τ alone by up to 0.110 (at ω = 1)" in text
    assert "C = 128" not in text  # a panel without cells is left out
