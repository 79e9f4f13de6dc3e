"""``bench/`` is not an installed package (benchmarks do not ship), so put the project root on
``sys.path`` for these tests, as ``python -m bench.NAME`` does when run from the root."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
