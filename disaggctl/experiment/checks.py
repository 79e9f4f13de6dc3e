"""What a referee checks in a report's tables before reading them (docs/design.md §8).

- **No run shown twice as two arms.** Two rows of one table whose measured cells (every cell
  that carries a standard error, ``±``) are all equal, three or more of them, are one run under
  two names: a report shows such a run once and names it in the other row (``the run of …``).
  A table with a ``phase`` column shows a run as one row per phase: there an arm's rows are
  compared together, since two arms run alike until a controller first acts.
- **No ratio without its error.** A column whose header says it is a ratio (ending in ``×``,
  or naming a ``ratio``, a ``share`` or ``/ static``) holds ``mean ± s.e.`` in every measured
  cell.

:func:`same_run_of` finds the arms that are one run from their trials, for a report to show
them once.

:func:`report_problems` lists what a Markdown report breaks; the experiments' tests run it on
``docs/results.md``.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["report_problems", "same_run_of", "tables"]

K = TypeVar("K", bound=Hashable)
_RATIO_HEADER = re.compile(r"×\s*$|\bratio\b|\bshare\b|/ ?static")
_NUMBER = re.compile(r"^-?\d[\d.]*(e-?\d+)?$")
MIN_MEASURED = 3  # equal cells that make two rows one run; fewer can agree by chance


def tables(markdown: str) -> Iterator[tuple[int, list[str], list[list[str]]]]:
    """Every pipe table of ``markdown``: (its header's line number, the header, the rows)."""
    lines = markdown.splitlines()
    i = 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1]):
            header = _cells(lines[i])
            rows, j = [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(_cells(lines[j]))
                j += 1
            yield i + 1, header, rows
            i = j
        else:
            i += 1


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def same_runs(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[tuple[int, int]]:
    """Pairs of rows (indices; with a ``phase`` column, an arm's first rows) whose measured
    cells are all equal, at least ``MIN_MEASURED`` of them."""
    phase = header.index("phase") if "phase" in header else None
    arms: dict[tuple[str, ...], list[int]] = {}
    for k, row in enumerate(rows):
        arms.setdefault(tuple(row[:phase]) if phase is not None else (str(k),), []).append(k)
    seen: dict[tuple[tuple[int, str], ...], int] = {}
    pairs = []
    for members in arms.values():
        measured = tuple((c, v) for k in members for c, v in enumerate(rows[k]) if "±" in v)
        if len(measured) < MIN_MEASURED:
            continue
        if measured in seen:
            pairs.append((seen[measured], members[0]))
        else:
            seen[measured] = members[0]
    return pairs


def same_run_of(
    arms: Mapping[K, Sequence[Mapping[str, Any]]], keys: Sequence[str]
) -> dict[K, K]:
    """The arms whose trials (in order) equal an earlier arm's on every one of ``keys``, each
    to that earlier arm: a deterministic simulator gives equal figures only to equal runs."""
    first: dict[tuple[tuple[Any, ...], ...], K] = {}
    out: dict[K, K] = {}
    for arm, trials in arms.items():
        figures = tuple(tuple(t.get(k) for k in keys) for t in trials)
        if figures in first:
            out[arm] = first[figures]
        else:
            first[figures] = arm
    return out


def bare_ratios(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[tuple[int, str]]:
    """(row index, column) of every number in a ratio column printed without ``±``."""
    columns = [c for c, h in enumerate(header) if _RATIO_HEADER.search(h)]
    out = []
    for k, row in enumerate(rows):
        for c in columns:
            if c < len(row) and _NUMBER.match(row[c]):
                out.append((k, header[c]))
    return out


def report_problems(markdown: str) -> list[str]:
    """Each table row that repeats another's run, and each ratio without its error, named by
    the line of its table's header."""
    problems = []
    for line, header, rows in tables(markdown):
        for a, b in same_runs(header, rows):
            problems.append(
                f"table at line {line}: rows {a + 1} and {b + 1} are one run "
                f"({' | '.join(rows[a][:4])} and {' | '.join(rows[b][:4])})"
            )
        for k, column in bare_ratios(header, rows):
            problems.append(
                f"table at line {line}, row {k + 1}: the ratio in {column!r} has no error"
            )
    return problems
