"""Mean ± 1 standard error over trials, and the tables built from them.

The standard error is the sample standard deviation (n − 1 in the denominator) over √n. A figure
that could not be measured in a trial (``None`` or NaN: no request finished in the window) is left
out of that figure's mean and counted in ``n``; with fewer than two measured trials the error is
``None`` (unknown, never 0), and with none the mean is ``None`` too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["fmt", "fmt_mean_se", "mean_se", "ratio_of_means", "routing_share", "summarise"]


def _measured(values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if v is None or isinstance(v, bool):
            continue
        x = float(v)
        if math.isfinite(x):
            out.append(x)
    return out


def mean_se(values: Iterable[Any]) -> tuple[float | None, float | None]:
    """(mean, standard error) of the finite values; ``None`` where there are too few.

    >>> mean_se([1.0, 2.0, 3.0])
    (2.0, 0.5773502691896257)
    >>> mean_se([4.0, None, float("nan")])
    (4.0, None)
    >>> mean_se([])
    (None, None)
    """
    xs = _measured(values)
    if not xs:
        return None, None
    mean = math.fsum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None
    var = math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return mean, math.sqrt(var / len(xs))


def ratio_of_means(
    numerators: Iterable[Any], denominators: Iterable[Any]
) -> tuple[float | None, float | None]:
    """R = x̄ / ȳ over the paired trials where both are measured, and its standard error by the
    delta method, ``se(R) = √(s²ₓ − 2R·sₓᵧ + R²·s²ᵧ) / (|ȳ|·√n)`` (sample (co)variances, n − 1);
    ``None`` where ȳ ≤ 0 or nothing is measured, the error ``None`` below two trials.

    >>> r, se = ratio_of_means([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    >>> round(r, 6), round(se, 6)
    (0.5, 0.0)
    >>> ratio_of_means([1.0], [2.0])
    (0.5, None)
    """
    pairs = [
        (x, y)
        for x, y in zip(numerators, denominators, strict=True)
        if _measured([x]) and _measured([y])
    ]
    if not pairs:
        return None, None
    xs, ys = [float(x) for x, _ in pairs], [float(y) for _, y in pairs]
    n, mx, my = len(pairs), math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    if my <= 0:
        return None, None
    ratio = mx / my
    if n < 2:
        return ratio, None
    vx = math.fsum((x - mx) ** 2 for x in xs) / (n - 1)
    vy = math.fsum((y - my) ** 2 for y in ys) / (n - 1)
    cxy = math.fsum((x - mx) * (y - my) for x, y in pairs) / (n - 1)
    var = max(0.0, vx - 2 * ratio * cxy + ratio * ratio * vy)
    return ratio, math.sqrt(var) / (my * math.sqrt(n))


def summarise(
    trials: Sequence[Mapping[str, Any]], keys: Sequence[str]
) -> dict[str, float | int | None]:
    """``{key: mean, key_se: error}`` for each of ``keys`` over ``trials``, plus ``trials``."""
    row: dict[str, float | int | None] = {"trials": len(trials)}
    for key in keys:
        row[key], row[f"{key}_se"] = mean_se(t.get(key) for t in trials)
    return row


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a table: ``digits`` significant figures in fixed notation (scientific only
    past 10⁶ or below 10⁻⁴), ``–`` when unknown.

    >>> fmt(0.012345), fmt(1234.5), fmt(2.0), fmt(None), fmt(3e-7)
    ('0.0123', '1234', '2.00', '–', '3e-07')
    """
    if value is None or not math.isfinite(value):
        return "–"
    if value == 0:
        return "0"
    mag = math.floor(math.log10(abs(value)))
    if mag >= 6 or mag < -4:
        return f"{value:.{max(0, digits - 1)}g}"
    return f"{value:.{max(0, digits - 1 - mag)}f}"


def fmt_mean_se(mean: float | None, se: float | None, digits: int = 3) -> str:
    """``mean ± se``: the mean to ``digits`` significant figures, the error to two; the mean
    alone when the error is unknown.

    >>> fmt_mean_se(2.0, 0.5773), fmt_mean_se(0.01234, None), fmt_mean_se(0.4, 4e-17)
    ('2.00 ± 0.58', '0.0123', '0.400 ± 0')
    """
    if mean is None or not math.isfinite(mean):
        return "–"
    if se is None or not math.isfinite(se):
        return fmt(mean, digits)
    if se <= 1e-9 * abs(mean):  # rounding noise of identical trials
        se = 0.0
    return f"{fmt(mean, digits)} ± {fmt(se, 2)}"


def routing_share(rows: list[dict[str, Any]]) -> float | None:
    """The share of the spread of log poa_hat across ``rows`` that is in log poa_routing (the
    two factors' shares sum to 1, since log poa_hat = log poa_routing + log poa_capacity);
    None when poa_hat does not vary."""
    hat = np.log([r["poa_hat"] for r in rows])
    routing = np.log([r["poa_routing"] for r in rows])
    spread = float(np.var(hat))
    if spread <= 0:
        return None
    return float(np.mean((routing - routing.mean()) * (hat - hat.mean()))) / spread
