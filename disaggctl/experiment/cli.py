"""``disaggctl experiment NAME``: the experiments of docs/design.md §8 on the simulator."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from cluster.models import StrictModel
from disaggctl.experiment.base import Settings
from disaggctl.experiment.runner import EXPERIMENTS, OPTIONAL, run
from disaggctl.jsonout import strict_dumps
from disaggctl.options import UsageError, from_args, writable_dir

MAX_TRIALS = 20
AddFlags = Callable[[argparse.ArgumentParser], None]


class ExperimentOptions(StrictModel):
    name: str
    out: Annotated[Path, Field(strict=False), AfterValidator(writable_dir)] = Path(
        "results/experiments"
    )
    trials: int = Field(default=3, ge=1, le=MAX_TRIALS)
    quick: bool = False
    no_ray: bool = False
    write_docs: bool = False
    docs: Annotated[Path, Field(strict=False)] = Path("docs")
    traces: Annotated[Path, Field(strict=False)] | None = None
    progress: bool | None = None
    quiet: bool = False


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    formatter: type[argparse.HelpFormatter] = argparse.ArgumentDefaultsHelpFormatter,
    output_flags: AddFlags | None = None,
) -> None:
    p = sub.add_parser(
        "experiment",
        help="the experiments of docs/design.md §8: JSON, CSV, plots and a report",
        description="Run one experiment (or all) on the simulator: every independent simulation "
        "a Ray task on a local Ray (or in this process with --no-ray; the same numbers), three "
        "trials per point, mean ± 1 standard error. Writes --out/NAME/ (NAME.json, CSVs, PNGs, "
        "report.md) and, for all, --out/report.md; prints the expected duration first. "
        "--quick: a reduced version of everything (a few minutes on 2 cores).",
        formatter_class=formatter,
    )
    p.add_argument(
        "name", choices=[*EXPERIMENTS, *OPTIONAL, "all"],
        help=f"which experiment (all: every one but {', '.join(OPTIONAL)}, which need Dynamo)",
    )  # fmt: skip
    p.add_argument(
        "--out", type=Path, default=Path("results/experiments"), help="results folder (created)"
    )
    p.add_argument(
        "--trials",
        type=int,
        default=3,
        help=f"trials (seeds 0 … trials − 1) per point, 1 to {MAX_TRIALS}",
    )
    p.add_argument("--quick", action="store_true", help="the reduced version of every sweep")
    p.add_argument(
        "--no-ray",
        action="store_true",
        help="run the simulations one after another in this process",
    )
    p.add_argument(
        "--write-docs",
        action="store_true",
        help="not with --quick: regenerate DOCS/results.md and DOCS/results/ (with one "
        "experiment: its section only, the others' kept)",
    )
    p.add_argument("--docs", type=Path, default=Path("docs"), help="where --write-docs writes")
    p.add_argument(
        "--traces", type=Path, default=argparse.SUPPRESS,
        help="traces: the folder with the full traces (mooncake_conversation.jsonl, "
        "azure_llm_2023_code.csv); default ../shared/traces, else the slices in data/traces",
    )  # fmt: skip
    if output_flags:
        output_flags(p)
    p.set_defaults(func=main)


def _command(o: ExperimentOptions) -> str:
    """The command line that reproduces this run (defaults left out)."""
    words = ["disaggctl", "experiment", o.name]
    if o.quick:
        words.append("--quick")
    if o.trials != 3:
        words += ["--trials", str(o.trials)]
    if o.no_ray:
        words.append("--no-ray")
    if o.write_docs:
        words.append("--write-docs")
    return " ".join(words)


def main(args: argparse.Namespace) -> int:
    o = from_args(ExperimentOptions, args)
    if o.write_docs and o.quick:
        raise UsageError("--write-docs needs a full run, not --quick (docs hold full runs)")
    names = list(EXPERIMENTS) if o.name == "all" else [o.name]
    written = run(
        names,
        o.out,
        Settings(o.quick, o.trials, None if o.traces is None else str(o.traces)),
        use_ray=not o.no_ray,
        docs=o.docs if o.write_docs else None,
        progress=o.progress,
        quiet=o.quiet,
        command=_command(o),
    )
    print(strict_dumps(written, indent=2))
    return 0
