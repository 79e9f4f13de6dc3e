"""Independent simulations, run in this process or fanned out as Ray tasks (docs/design.md §8).

A ``Job`` names a module-level function by its dotted path (``"package.module:function"``) and
its keyword arguments, all plain data: a Ray worker imports the function itself, so nothing but
the names and the arguments crosses the process boundary, and ``bench.*`` functions (``bench/``
is not an installed package) import in a worker once the project root is on its path. Every job
is deterministic in its arguments (the seed is one of them), so ``--no-ray`` and Ray give the
same results, returned in job order either way.

``RaySession`` starts a local Ray for the run (``cluster.ray.runtime.init_ray``: dashboard off, a
short temporary folder under /tmp, one CPU per available core) unless one is already running in
this process, and shuts down only what it started.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from cluster.progress import progress_bar

__all__ = ["Job", "RaySession", "available_cores", "bench_module", "call", "run_jobs"]

ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Job:
    """One independent simulation: ``fn`` (``"module:function"``) called with ``kwargs``.

    ``units`` is the job's size in its experiment's cost unit (simulated seconds, batches…),
    which the duration estimate multiplies by the experiment's measured seconds per unit."""

    fn: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    units: float = 1.0


def bench_module(name: str) -> ModuleType:
    """``bench.<name>`` (``bench/`` is not installed: the project root goes on the path)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    return importlib.import_module(f"bench.{name}")


def resolve(path: str) -> Callable[..., Any]:
    """The function ``"module:function"`` names (the project root on ``sys.path`` first, so that
    ``bench.*`` imports as it does under ``python -m bench.NAME``)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    module, _, name = path.partition(":")
    fn = getattr(importlib.import_module(module), name)
    if not callable(fn):
        raise TypeError(f"{path} is not callable")
    return fn  # type: ignore[no-any-return]


def call(path: str, kwargs: dict[str, Any]) -> tuple[Any, float]:
    """Run one job; its result and the seconds it took."""
    started = time.perf_counter()
    result = resolve(path)(**kwargs)
    return result, time.perf_counter() - started


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class RaySession:
    """A local Ray for the lifetime of a ``with`` block; joins one that is already running."""

    def __init__(self, num_cpus: int | None = None) -> None:
        self.num_cpus = num_cpus or available_cores()
        self.owned = False
        self.tmpdir: str | None = None

    def __enter__(self) -> RaySession:
        from cluster.ray.runtime import init_ray

        started = init_ray(num_cpus=self.num_cpus)
        self.owned, self.tmpdir = started.owned, started.tmpdir
        return self

    @property
    def workers(self) -> int:
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))  # type: ignore[no-untyped-call]

    def __exit__(self, *exc: object) -> None:
        if not self.owned:
            return
        import ray

        ray.shutdown()
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


@contextmanager
def maybe_ray(use_ray: bool) -> Iterator[RaySession | None]:
    if not use_ray:
        yield None
        return
    with RaySession() as session:
        yield session


def _ray_call(path: str, kwargs: dict[str, Any]) -> tuple[Any, float]:
    return call(path, kwargs)


def run_jobs(
    jobs: Sequence[Job],
    *,
    use_ray: bool,
    desc: str,
    progress: bool | None = None,
    quiet: bool = False,
) -> tuple[list[Any], list[float]]:
    """Every job's result (in job order) and seconds; as Ray tasks when ``use_ray`` (Ray must be
    initialised: see ``RaySession``), else one after another in this process."""
    results: list[Any] = [None] * len(jobs)
    seconds = [0.0] * len(jobs)
    with progress_bar(total=len(jobs), desc=desc, progress=progress, quiet=quiet) as bar:
        if not use_ray:
            for i, job in enumerate(jobs):
                results[i], seconds[i] = call(job.fn, job.kwargs)
                bar.update(1)
            return results, seconds
        import ray

        task = ray.remote(num_cpus=1, max_retries=0)(_ray_call)
        pending = {task.remote(job.fn, job.kwargs): i for i, job in enumerate(jobs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i = pending.pop(ref)
                results[i], seconds[i] = ray.get(ref)
                bar.update(1)
    return results, seconds
