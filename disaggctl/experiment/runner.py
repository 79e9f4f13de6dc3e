"""Running experiments: plan, estimate, fan out, analyse, write (docs/design.md §8).

Each experiment writes ``<out>/<name>/``: ``<name>.json`` (strict JSON: ``setup``, ``results``,
and ``run``, the only part that differs between runs of the same seeds: durations, Ray or not),
CSVs, PNGs and ``report.md``. Running several writes ``<out>/report.md`` with every section, and
``write_docs`` regenerates ``docs/results.md`` from it with the figures copied under
``docs/results/``.

The expected duration is printed before anything runs: every job has a size in its experiment's
unit (simulated seconds, batches) and every experiment a measured ``SECONDS_PER_UNIT``; their sum,
scaled by how fast this machine runs a small probe simulation against the reference machine, over
the number of workers. Each JSON's ``run`` records the seconds per unit this run measured.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from disaggctl.experiment.base import Settings
from disaggctl.experiment.fanout import available_cores, maybe_ray, run_jobs
from disaggctl.experiment.report import (
    Section,
    knob_table,
    render,
    update_docs,
    write_docs,
    write_json,
)

__all__ = ["EXPERIMENTS", "OPTIONAL", "estimate", "load", "run"]

EXPERIMENTS = ("poa", "pareto", "adaptive", "autobid", "auction", "priority", "traces")
# Run by name only, not by `all`: they need what `make demo` does not install (Dynamo).
OPTIONAL = ("crosscheck", "controller")
# probe() on the machine SECONDS_PER_UNIT were measured on (2 cores, the development container),
# measured again with them: each is the seconds per unit of the last full `experiment all` run's
# Ray workers (its JSON's run.seconds_per_unit times run.machine_speed_vs_reference), since the
# probe and the experiments slow down together when the code does (the PoA replay made both
# about 3–7× slower, and an estimate against the old reference read 102 min for a 29 min run).
PROBE_REFERENCE_S = 0.31


def load(name: str) -> ModuleType:
    if name not in (*EXPERIMENTS, *OPTIONAL):
        known = ", ".join((*EXPERIMENTS, *OPTIONAL))
        raise ValueError(f"unknown experiment {name!r}; known: {known}")
    return importlib.import_module(f"disaggctl.experiment.{name}")


def probe() -> float:
    """Seconds a small fixed simulation takes here (best of three)."""
    from disaggctl.experiment.poa import LLAMA, run_point

    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        run_point(LLAMA, "1P/2D", 16, 0, 2.0, 4.0)
        best = min(best, time.perf_counter() - t)
    return best


def estimate(plans: dict[str, Any], workers: int, speed: float = 1.0) -> float:
    """Expected wall seconds: Σ units × seconds per unit × ``speed`` (probe / reference) over
    the workers (each experiment's jobs fan out over ``workers``, at most one per job)."""
    total = 0.0
    for name, plan in plans.items():
        per_unit = load(name).SECONDS_PER_UNIT
        work = sum(job.units for job in plan.jobs) * per_unit * speed
        total += work / max(1, min(workers, len(plan.jobs)))
    return total


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def run(
    names: Sequence[str],
    out: Path,
    settings: Settings,
    *,
    use_ray: bool = True,
    docs: Path | None = None,
    progress: bool | None = None,
    quiet: bool = False,
    command: str = "",
) -> dict[str, Any]:
    """Run ``names`` in order; returns what was written and how long it took."""
    modules = {name: load(name) for name in names}
    plans = {name: m.plan(settings) for name, m in modules.items()}
    workers = available_cores() if use_ray else 1
    speed = probe() / PROBE_REFERENCE_S
    expected = estimate(plans, workers, speed)
    jobs = sum(len(p.jobs) for p in plans.values())
    _say(
        quiet,
        f"experiment {' '.join(names)}: {jobs} simulations on {workers} worker(s), "
        f"expected about {_duration(expected)}",
    )
    started = time.perf_counter()
    sections: list[Section] = []
    written: dict[str, Any] = {}
    with maybe_ray(use_ray) as session:
        if session is not None:
            workers = session.workers
        for name, module in modules.items():
            t0 = time.perf_counter()
            plan = plans[name]
            results, seconds = run_jobs(
                plan.jobs, use_ray=use_ray, desc=name, progress=progress, quiet=quiet
            )
            data = module.analyse(plan, results)
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            section = Section(name, module.TITLE)
            section.text((module.__doc__ or "").split("\n\n", 1)[1].strip())
            section.text("Setup:\n\n" + knob_table(plan.setup))
            module.report(data, plan.setup, folder, section)
            wall = time.perf_counter() - t0
            units = sum(job.units for job in plan.jobs)
            run_info = {
                "ray": use_ray,
                "workers": workers,
                "jobs": len(plan.jobs),
                "wall_s": round(wall, 2),
                "job_s_sum": round(sum(seconds), 2),
                "seconds_per_unit": sum(seconds) / units / speed if units else None,
                "machine_speed_vs_reference": round(speed, 3),
                "quick": settings.quick,
                "trials": settings.trials,
                "command": command,
            }
            section.text(
                f"{len(plan.jobs)} simulations, {_duration(wall)} on {workers} worker(s)"
                f"{' (Ray)' if use_ray else ''}."
            )
            payload = {
                "experiment": name,
                "title": module.TITLE,
                "setup": plan.setup,
                "results": data,
                "run": run_info,
            }
            write_json(folder / f"{name}.json", payload)
            (folder / "report.md").write_text(render(section, prefix="", level=1))
            sections.append(section)
            written[name] = {"folder": str(folder), "wall_s": round(wall, 2)}
    total = time.perf_counter() - started
    preamble = _preamble(settings, command, total, expected)
    if len(sections) > 1:
        body = [preamble] + [render(s, prefix=f"{s.name}/") for s in sections]
        (out / "report.md").write_text("\n".join(body))
        written["report"] = str(out / "report.md")
    if docs is not None and len(sections) == len(EXPERIMENTS):
        keep = [load(name).TITLE for name in OPTIONAL]
        written["docs"] = str(write_docs(sections, out, docs, preamble, keep=keep))
    elif docs is not None:  # one experiment again: its sections in place, the others kept
        written["docs"] = str(update_docs(sections, out, docs))
    written["wall_s"] = round(total, 2)
    written["expected_s"] = round(expected, 1)
    _say(quiet, f"done in {_duration(total)} (expected {_duration(expected)})")
    return written


def _preamble(settings: Settings, command: str, total: float, expected: float) -> str:
    kind = "quick (reduced)" if settings.quick else "full"
    return (
        "# Experiment results\n\n"
        f"Generated by `{command or 'disaggctl experiment'}`: a {kind} run on the simulator, "
        f"{settings.trials} trial(s) per point (seeds {', '.join(map(str, settings.seeds))}), "
        "numbers as mean ± 1 standard error over the trials. "
        f"The run took {_duration(total)} (estimated {_duration(expected)} up front). "
        "Every paragraph under a figure is computed from the numbers it shows.\n"
    )
