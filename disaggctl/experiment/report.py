"""Writing an experiment's results: strict JSON, CSV with a header, and a Markdown section.

A section is a list of blocks: Markdown text, or a ``Figure`` (a PNG in the experiment's folder, a
caption and the paragraph that says what it shows). Figures are rendered with a link prefix, so
the same section reads right in the experiment's own ``report.md`` (``fig.png``), in the combined
report one folder up (``poa/fig.png``) and in ``docs/results.md`` (``results/poa/fig.png``).
"""

from __future__ import annotations

import csv
import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from disaggctl.experiment.stats import fmt, fmt_mean_se
from disaggctl.jsonout import finite, strict_dumps

__all__ = [
    "Figure",
    "Section",
    "knob_table",
    "markdown_table",
    "render",
    "stat_cell",
    "update_docs",
    "write_csv",
    "write_docs",
    "write_json",
]


@dataclass(frozen=True)
class Figure:
    file: str  # a PNG in the experiment's folder
    caption: str
    paragraph: str


@dataclass
class Section:
    """One experiment's part of a report."""

    name: str
    title: str
    blocks: list[str | Figure] = field(default_factory=list)

    def text(self, markdown: str) -> None:
        self.blocks.append(markdown.strip())

    def figure(self, file: str, caption: str, paragraph: str) -> None:
        self.blocks.append(Figure(file, caption, paragraph))

    @property
    def figures(self) -> list[Figure]:
        return [b for b in self.blocks if isinstance(b, Figure)]


def render(section: Section, prefix: str = "", level: int = 2) -> str:
    """The section as Markdown, figure links as ``prefix + file``."""
    out = [f"{'#' * level} {section.title}"]
    for block in section.blocks:
        if isinstance(block, Figure):
            out.append(f"![{block.caption}]({prefix}{block.file})")
            out.append(f"*{block.caption}.* {block.paragraph}")
        else:
            out.append(block)
    return "\n\n".join(out) + "\n"


def write_json(path: Path, obj: Any) -> Path:
    """Strict JSON (a non-finite float becomes null; NaN can never reach the file)."""
    path.write_text(strict_dumps(obj, indent=2) + "\n")
    return path


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Rows of plain values with a header (the union of the rows' keys, in first-seen order);
    an unknown figure is an empty cell."""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(finite(row.get(k))) for k in columns})
    return path


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return " ".join(str(v) for v in value)
    return value


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A pipe table; cells are written as given (strings) or formatted (numbers)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return fmt(v)
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def stat_cell(row: Mapping[str, Any], key: str, digits: int = 3, scale: float = 1.0) -> str:
    """``row[key] ± row[key_se]`` (times ``scale``) for a table."""
    mean, se = row.get(key), row.get(f"{key}_se")
    if mean is not None:
        mean = mean * scale
    if se is not None:
        se = se * scale
    return fmt_mean_se(mean, se, digits)


def knob_table(knobs: Mapping[str, Any]) -> str:
    """The setup: every knob and its value."""
    rows = []
    for key, value in knobs.items():
        if isinstance(value, float) and math.isfinite(value):
            shown = f"{value:g}"
        elif isinstance(value, Mapping) and any(isinstance(v, Mapping) for v in value.values()):
            shown = "(a table of its own, below)"
        elif isinstance(value, Mapping):
            shown = "; ".join(f"{k}: {v}" for k, v in value.items())
        elif isinstance(value, list | tuple):
            shown = ", ".join(str(v) for v in value)
        else:
            shown = str(value)
        rows.append((key, shown))
    return markdown_table(("knob", "value"), rows)


def _parts(text: str, titles: Sequence[str]) -> list[str]:
    """The parts of a results page under the ``## title`` headings given, as they stand."""
    kept = []
    for title in titles:
        start = text.find(f"## {title}\n")
        if start >= 0:
            end = text.find("\n## ", start + 1)
            kept.append(text[start:] if end < 0 else text[start : end + 1])
    return kept


def write_docs(
    sections: Sequence[Section],
    out: Path,
    docs: Path,
    preamble: str,
    name: str = "results",
    keep: Sequence[str] = (),
) -> Path:
    """``docs/<name>.md`` from ``sections``, every figure copied to ``docs/<name>/<exp>/``
    (relative links, so the page renders on GitHub and in any Markdown viewer). The parts of
    the old page titled ``keep`` (experiments this run did not run) stay, after the new ones."""
    old = docs / f"{name}.md"
    kept = _parts(old.read_text(), keep) if old.is_file() else []
    target = docs / name
    for section in sections:
        folder = target / section.name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for fig in section.figures:
            shutil.copy2(out / section.name / fig.file, folder / fig.file)
    body = [preamble.strip() + "\n"]
    body += [render(s, prefix=f"{name}/{s.name}/") for s in sections]
    body += kept
    path = docs / f"{name}.md"
    path.write_text("\n".join(body))
    return path


def update_docs(sections: Sequence[Section], out: Path, docs: Path, name: str = "results") -> Path:
    """``docs/<name>.md`` with only ``sections`` regenerated: each replaces its own part (from
    its ``## title`` to the next ``## ``), or comes last if the page has none; the other
    experiments' parts and the preamble stay as the last full run wrote them."""
    path = docs / f"{name}.md"
    if not path.is_file():
        raise ValueError(f"{path}: no results page to update; run `all --write-docs` first")
    text = path.read_text()
    target = docs / name
    for section in sections:
        folder = target / section.name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for fig in section.figures:
            shutil.copy2(out / section.name / fig.file, folder / fig.file)
        body = render(section, prefix=f"{name}/{section.name}/")
        heading = f"## {section.title}\n"
        start = text.find(heading)
        if start < 0:
            text = text.rstrip("\n") + "\n\n" + body
            continue
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + body + ("" if end < 0 else text[end + 1 :])
    path.write_text(text)
    return path
