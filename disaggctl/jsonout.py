"""Strict JSON for everything the CLI prints or writes.

``json.dumps`` writes NaN and Infinity by default, which no JSON parser outside Python accepts.
A figure that could not be measured (no request finished in the window) is written as ``null``
instead, and ``allow_nan=False`` makes any float that slipped through an error, never output.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["finite", "strict_dumps"]


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by ``None`` and numpy scalars made plain."""
    if isinstance(obj, bool | None | str):
        return obj
    if isinstance(obj, float | np.floating):
        value = float(obj)
        return value if math.isfinite(value) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, Mapping):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def strict_dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` that never emits NaN or Infinity (they become ``null``)."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)
