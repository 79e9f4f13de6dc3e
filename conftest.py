"""Test-session settings shared by every test folder and the doctests.

Hypothesis runs under one of two profiles, chosen by ``HYPOTHESIS_PROFILE`` (default: ``ci`` when
the ``CI`` variable is set, ``dev`` otherwise):

- ``ci``: derandomized (the same examples on every run) and no example database, so a clean clone
  always runs the same suite and a failure found once cannot leak into later runs.
- ``dev``: random seeds (``--hypothesis-seed`` picks one) and more examples, to find new failures;
  failures are kept in ``.hypothesis/`` (ignored by git) and replayed first.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    max_examples=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
