"""Benchmarks: each prints JSON; run as modules, e.g. ``python -m bench.auction``."""
