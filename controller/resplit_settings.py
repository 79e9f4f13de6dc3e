"""The re-split lever's settings and the one table of their bounds (``controller.resplit``
explains each rule they tune)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

# One table of bounds, for this dataclass and the config's edge model
# (``cluster.ray.controller_pools.ResplitSection``), as the auction's ``SETTING_BOUNDS``.
RESPLIT_BOUNDS: Final[Mapping[str, tuple[float, float]]] = {
    "dominance": (1.0, 1e6),
    "dwell_ticks": (1, 100_000),
    "release_fraction": (0.0, 1.0),
    "release_ticks": (1, 100_000),
    "cooldown_s": (0.0, 86_400.0),  # a day: longer is "never", which enabled: false says
    "min_prefill": (0, 4096),
    "min_decode": (1, 4096),
}
_COUNTS = frozenset({"dwell_ticks", "release_ticks", "min_prefill", "min_decode"})


def _count(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class ResplitSettings:
    """``dominance``: poa_capacity / poa_routing at which saturation counts as capacity-bound
    (2: capacity explains at least twice what routing could recover). ``dwell_ticks``: ticks the
    condition must hold before a move up (one noisy window never moves a worker).
    ``release_fraction``: the share of the smaller split's SLO capacity the demand must stay
    under before a move back (0.8: 20% headroom, the margin a queue needs to stay short);
    ``release_ticks``: ticks it must stay there (longer than the dwell: keeping capacity a little
    too long is the cheap mistake). ``cooldown_s``: seconds after a re-split finishes before the
    next may start. ``min_prefill`` / ``min_decode``: never fewer."""

    dominance: float = 2.0
    dwell_ticks: int = 5
    release_fraction: float = 0.8
    release_ticks: int = 30
    cooldown_s: float = 20.0
    min_prefill: int = 1
    min_decode: int = 1

    def __post_init__(self) -> None:
        for name, (low, high) in RESPLIT_BOUNDS.items():
            value: object = getattr(self, name)
            if name in _COUNTS:
                _count(name, value, int(low), int(high))
            elif (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or not low <= value <= high
            ):
                raise ValueError(
                    f"{name} must be a finite number in [{low:g}, {high:g}], got {value!r}"
                )
