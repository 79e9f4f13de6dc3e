"""The regime → routing policy table (docs/design.md §4).

Default: below τ = 0, ω = 1.0 (cache affinity, deterministic); transition τ = 0.7, ω = 1.0;
saturated τ = 0.8, ω = 0.1 (spread load, barely weigh the cache). Loadable from YAML:

    below:      {tau: 0.0, omega: 1.0}
    transition: {tau: 0.7, omega: 1.0}
    saturated:  {tau: 0.8, omega: 0.1}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from controller.detector import Regime
from router.cost import MAX_OMEGA


@dataclass(frozen=True)
class RegimePolicy:
    tau: float
    omega: float

    def __post_init__(self) -> None:
        for name, value in (("tau", self.tau), ("omega", self.omega)):
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        # The router refuses a larger omega at set_policy; refuse it here, where the table is
        # read, rather than in the middle of a control tick.
        if self.omega > MAX_OMEGA:
            raise ValueError(f"omega must be <= {MAX_OMEGA:g}, got {self.omega!r}")


@dataclass(frozen=True)
class PolicyTable:
    below: RegimePolicy = RegimePolicy(0.0, 1.0)
    transition: RegimePolicy = RegimePolicy(0.7, 1.0)
    saturated: RegimePolicy = RegimePolicy(0.8, 0.1)

    def __getitem__(self, regime: Regime) -> RegimePolicy:
        return {
            Regime.BELOW: self.below,
            Regime.TRANSITION: self.transition,
            Regime.SATURATED: self.saturated,
        }[regime]

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str = "policy") -> PolicyTable:
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a mapping of regimes")
        names = [r.label for r in Regime]
        missing = [n for n in names if n not in raw]
        unknown = sorted(set(raw) - set(names))
        if missing or unknown:
            raise ValueError(
                f"{where}: needs exactly {', '.join(names)}; "
                f"missing {missing or 'none'}, unknown {unknown or 'none'}"
            )
        rows = {}
        for name in names:
            entry = raw[name]
            if not isinstance(entry, Mapping) or set(entry) != {"tau", "omega"}:
                raise ValueError(f"{where}.{name}: expected {{tau, omega}}, got {entry!r}")
            try:
                rows[name] = RegimePolicy(entry["tau"], entry["omega"])
            except ValueError as exc:
                raise ValueError(f"{where}.{name}: {exc}") from None
        return cls(**rows)

    @classmethod
    def load(cls, path: str | Path) -> PolicyTable:
        text = Path(path).read_text()
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not YAML ({exc})") from None
        return cls.from_mapping(raw, where=str(path))
