"""``disaggctl replay TRACE``: a production trace replayed open loop (docs/design.md §8).

On the simulator (the default) each ``--policy`` is an arm, run as a Ray task (or in this
process with ``--no-ray``) on a fresh cluster of ``--profile`` and ``--topology``; against a
running service (``--live URL``) the trace is sent over HTTP at its recorded times. Either way
``--out`` receives the per-request JSONL and per-tick JSON of every arm, ``summary.md`` (each
arm's figures and its ratio to the first), ``summary.json`` and the plots.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator

from cluster.models import StrictModel
from cluster.progress import progress_bar
from cluster.sim.profile import available_profiles, load_profile, normalise_topology
from cluster.sim.replay import parse_arm, trace_calm_thresholds
from cluster.traces import FORMATS, parse_sharing, parse_window
from cluster.traces.lines import MAX_BLOCK_TOKENS
from cluster.traces.window import MAX_REQUESTS, MAX_SPEEDUP
from disaggctl.experiment.fanout import Job, maybe_ray, run_jobs
from disaggctl.jsonout import strict_dumps
from disaggctl.options import MAX_SEED, UsageError, from_args, writable_dir
from disaggctl.replay.live_arm import run_live_arm
from disaggctl.replay.outcome import ArmOutcome
from disaggctl.replay.report import write_report
from disaggctl.replay.sim_arm import TraceSpec, open_trace, run_sim_arm

__all__ = ["ReplayOptions", "add_parser", "main"]

AddFlags = Callable[[argparse.ArgumentParser], None]
CALM_REQUESTS = 256  # the trace's first requests, sent in turn by the calm baseline's clients
DEFAULT_POLICIES = ("static:0,1", "adaptive")
MAX_ARMS = 16


def _trace_file(path: Path) -> Path:
    if not path.is_file():
        raise ValueError("must be a trace file that exists")
    return path


def _known_profile(name: str) -> str:
    if name not in available_profiles():
        raise ValueError(f"must be one of {', '.join(available_profiles())}")
    return name


class ReplayOptions(StrictModel):
    trace: Annotated[Path, Field(strict=False), AfterValidator(_trace_file)]
    format: Literal["auto", "mooncake", "azure", "dynamo"] = "auto"
    skip_bad_lines: bool = False
    block_tokens: int = Field(default=512, ge=1, le=MAX_BLOCK_TOKENS)
    speedup: float = Field(default=1.0, gt=0.0, le=MAX_SPEEDUP)
    window: str | None = None
    max_requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    sharing: str | None = None
    profile: Annotated[str, AfterValidator(_known_profile)] = "b200-llama70b-fp8-tp4"
    topology: Annotated[str, AfterValidator(normalise_topology)] | None = None
    policy: list[str] = Field(default_factory=lambda: list(DEFAULT_POLICIES), max_length=MAX_ARMS)
    resplit: Literal["on", "off"] = "off"
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    out: Annotated[Path, Field(strict=False), AfterValidator(writable_dir)] = Path("results/replay")
    live: str | None = Field(default=None, pattern=r"^https?://[^\s]{1,500}$")
    metrics: str | None = Field(default=None, pattern=r"^https?://[^\s]{1,500}$")
    model: str | None = Field(default=None, max_length=128)
    api_key: str | None = Field(default=None, max_length=512)
    no_ray: bool = False
    progress: bool | None = None
    quiet: bool = False

    @field_validator("window")
    @classmethod
    def _window(cls, text: str | None) -> str | None:
        if text is not None:
            parse_window(text)
        return text

    @field_validator("sharing")
    @classmethod
    def _sharing(cls, text: str | None) -> str | None:
        parse_sharing(text)
        return text

    @field_validator("policy")
    @classmethod
    def _policies(cls, names: list[str]) -> list[str]:
        if not names:
            raise ValueError("give at least one policy")
        arms = [parse_arm(n).name for n in names]
        if len(set(arms)) != len(arms):
            raise ValueError(f"an arm is given twice: {', '.join(arms)}")
        return names

    def spec(self, context_tokens: int) -> TraceSpec:
        """The trace's reading and window, as plain values a Ray task takes."""
        window: dict[str, Any] = {"speedup": self.speedup, "max_requests": self.max_requests}
        if self.window is not None:
            window["start_s"], window["duration_s"] = parse_window(self.window)
        return {
            "trace": str(self.trace),
            "format": self.format,
            "skip_bad_lines": self.skip_bad_lines,
            "block_tokens": self.block_tokens,
            "context_tokens": context_tokens,
            "window": window,
            "seed": self.seed,
            "sharing": self.sharing,
        }


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    formatter: type[argparse.HelpFormatter] = argparse.ArgumentDefaultsHelpFormatter,
    output_flags: AddFlags | None = None,
) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a production trace (Mooncake, Azure, Dynamo) open loop, on the simulator "
        "or against a running service",
        description=__doc__,
        formatter_class=formatter,
    )
    p.add_argument("trace", type=Path, help="the trace file (JSONL or CSV, plain or gzip)")
    p.add_argument(
        "--format", default="auto", choices=("auto", *FORMATS), help="the trace's format"
    )
    p.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="count bad lines in the report instead of stopping at the first",
    )
    p.add_argument(
        "--block-tokens", type=int, default=512, help="tokens per Mooncake block id (512 in "
        "Mooncake's traces; a Dynamo trace states its own)",
    )  # fmt: skip
    p.add_argument(
        "--speedup", type=float, default=1.0, help="arrivals compressed: every arrival time / S"
    )
    p.add_argument(
        "--window", default=argparse.SUPPRESS, metavar="START:DURATION",
        help="replay only trace seconds [START, START + DURATION)",
    )  # fmt: skip
    p.add_argument("--max-requests", type=int, default=argparse.SUPPRESS, help="stop after N")
    p.add_argument(
        "--sharing", default=argparse.SUPPRESS, metavar="MODEL",
        help="for rows without block ids (Azure): 'prefix-groups:R:G' (each request shares the "
        "first R of its prompt with one of G groups); default: every prompt unique",
    )  # fmt: skip
    p.add_argument(
        "--profile", default="b200-llama70b-fp8-tp4", choices=available_profiles(),
        help="hardware profile of the simulated cluster",
    )  # fmt: skip
    p.add_argument(
        "--topology", default=argparse.SUPPRESS, help="xP/yD; default: the profile's own"
    )
    p.add_argument(
        "--policy", action="append", default=argparse.SUPPRESS, metavar="POLICY",
        help="an arm: adaptive (the study's table), evidence (routing by measured effect), "
        "round-robin or static:TAU,OMEGA (repeat for several; the first "
        f"is what the others are compared with); default: {' and '.join(DEFAULT_POLICIES)}",
    )  # fmt: skip
    p.add_argument(
        "--resplit", default="off", choices=("on", "off"),
        help="the controller's re-split lever in the adaptive arms",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="prompt synthesis and engine seed")
    p.add_argument("--out", type=Path, default=Path("results/replay"), help="results folder")
    p.add_argument(
        "--live", default=argparse.SUPPRESS, metavar="URL",
        help="replay against the service at URL over HTTP instead of on the simulator",
    )  # fmt: skip
    p.add_argument(
        "--metrics", default=argparse.SUPPRESS, metavar="URL",
        help="with --live: the service's metrics server, read every second into the ticks",
    )  # fmt: skip
    p.add_argument(
        "--model", default=argparse.SUPPRESS, help="with --live: the model name to ask for "
        "(default: the service's first)",
    )  # fmt: skip
    p.add_argument(
        "--api-key", default=argparse.SUPPRESS, help="with --live: a user's key (Bearer)"
    )
    p.add_argument(
        "--no-ray", action="store_true", help="run the arms one after another in this process"
    )
    if output_flags:
        output_flags(p)
    p.set_defaults(func=main)


def _setup(
    o: ReplayOptions, topology: str, thresholds: tuple[float, float] | None
) -> dict[str, Any]:
    setup: dict[str, Any] = {
        "trace": str(o.trace),
        "format": o.format,
        "speedup": o.speedup,
        "window": o.window or "whole trace",
        "max_requests": o.max_requests or "all",
        "sharing": o.sharing or "none (rows without ids: unique prompts)",
        "seed": o.seed,
    }
    if o.live is None:
        setup |= {"profile": o.profile, "topology": topology, "resplit": o.resplit}
        if thresholds is not None:
            setup["theta1_s"], setup["theta2_s"] = thresholds
    else:
        setup |= {"service": o.live, "metrics": o.metrics or "not read"}
    return setup


def _simulate(o: ReplayOptions) -> tuple[list[ArmOutcome], str, tuple[float, float]]:
    profile = load_profile(o.profile)
    topology = o.topology or profile.default_topology
    spec = o.spec(profile.context_tokens)
    calm_spec = {**spec, "window": {**spec["window"], "max_requests": CALM_REQUESTS}}
    _, first, prompts = open_trace(calm_spec)
    calm = list(first)
    if not calm:
        raise ValueError(f"{o.trace}: no request of the trace falls in the replayed window")
    t = trace_calm_thresholds(profile, topology, calm, prompts, seed=o.seed)
    thresholds = (t.theta1, t.theta2)
    jobs = [
        Job(
            "disaggctl.replay.sim_arm:run_sim_arm",
            {
                "spec": spec,
                "profile": o.profile,
                "topology": topology,
                "policy": name,
                "resplit": o.resplit == "on" and parse_arm(name).adaptive,
                "thresholds": thresholds,
                "seed": o.seed,
                "out": str(o.out),
            },
        )
        for name in o.policy
    ]
    if len(jobs) == 1 or o.no_ray:
        outcomes = [_in_process(job, o) for job in jobs]
    else:
        with maybe_ray(True):
            results, _ = run_jobs(
                jobs, use_ray=True, desc="arms", progress=o.progress, quiet=o.quiet
            )
        outcomes = list(results)
    return outcomes, topology, thresholds


def _in_process(job: Job, o: ReplayOptions) -> ArmOutcome:
    """One arm here, with a bar over its requests (sent / finished at the virtual clock)."""
    with progress_bar(desc=job.kwargs["policy"], unit="req", progress=o.progress,
                      quiet=o.quiet) as bar:  # fmt: skip

        def moved(sent: int, finished: int, now: float) -> None:
            bar.n = finished
            bar.set_postfix_str(f"sent {sent}, virtual {now:.0f} s", refresh=False)
            bar.refresh()

        return run_sim_arm(**job.kwargs, on_progress=moved)


def main(args: argparse.Namespace) -> int:
    o = from_args(ReplayOptions, args)
    if o.live is None and (o.metrics or o.model or o.api_key):
        raise UsageError("--metrics, --model and --api-key go with --live")
    if o.live is not None:
        outcomes = [run_live_arm(o)]
        topology, thresholds = "", None
        title = f"Live replay of {o.trace.name}"
    else:
        if o.resplit == "on" and not any(parse_arm(n).adaptive for n in o.policy):
            raise UsageError(
                "--resplit on needs an adaptive --policy: the lever is the controller's"
            )
        sim, topology, thresholds = _simulate(o)
        outcomes = sim
        title = f"Replay of {o.trace.name} on {o.profile} {topology}"
    written = write_report(o.out, outcomes, _setup(o, topology, thresholds), title)
    print(strict_dumps({
        "summary": str(written[0]),
        "arms": {x.name: x.summary for x in outcomes},
        "files": [str(p) for p in written] + [str(o.out / f) for x in outcomes for f in x.files],
    }, indent=2))  # fmt: skip
    return 0
