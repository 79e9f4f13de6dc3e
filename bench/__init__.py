"""Benchmarks, run as modules from the project root, e.g. ``.venv/bin/python -m bench.auction``.

Convention, shared through ``bench.common``: each bench prints one JSON document on stdout whose
top-level ``"met"`` is true only if every one of its targets is met, and whose ``"targets"`` gives
each target's limit, measured value and verdict; it exits with status 1 when a target is missed
(0 otherwise), so a script that never reads the JSON still sees the miss. The verdict comes from
a pure ``judge(report)`` per bench, unit-tested on synthetic reports (``tests/bench``). Progress
bars go to stderr, only on a terminal or with ``--progress``; ``--quiet`` turns them off.
"""
