"""The auction experiment's rows: the schedulers it compares and how its tables and plots pick
rows out of the analysed data."""

from __future__ import annotations

from typing import Any

SCHEDULERS = ("dfs-bid", "dfs-uniform", "dfs-weight", "bid-sort", "no-sort")


def pick(data: dict[str, Any], sweep: str, **match: Any) -> list[dict[str, Any]]:
    return [
        r for r in data["rows"] if r["sweep"] == sweep and all(r[k] == v for k, v in match.items())
    ]


def one(rows: list[dict[str, Any]], scheduler: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["scheduler"] == scheduler), None)
