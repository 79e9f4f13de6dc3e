"""The command line's values, one strict model per subcommand, checked before any work starts.

argparse reads the flags; the model bounds them (every size has a documented limit, numbers are
finite, names are known, the topology is normalised, the output folder is writable) and
:func:`from_args` turns a failure into one line per flag, ``--concurrency must be >= 1, got -5``.
The limits keep one command within a few GB and about a minute on a laptop (measured: see each).
"""

from __future__ import annotations

import argparse
import math
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, field_validator

from auction import SCHEDULERS
from cluster.models import StrictModel
from cluster.sim.profile import (
    MAX_CONCURRENCY,
    MAX_DECODE_WORKERS,
    MAX_PREFILL_WORKERS,
    available_profiles,
    normalise_topology,
)
from cluster.sim.workloads import GENERATORS

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_DECODE_WORKERS",
    "MAX_HOLD_S",
    "MAX_N",
    "MAX_PREFILL_WORKERS",
    "MAX_QUEUE",
    "MAX_SEED",
    "MAX_TOP",
    "MAX_USERS",
    "MIN_HOLD_S",
    "AuctionOptions",
    "DemoOptions",
    "SimCalibrateOptions",
    "SimExportOptions",
    "SimRunOptions",
    "UsageError",
    "from_args",
    "writable_dir",
]

# Requests per auction batch. Memory grows about 35 KB per request on the longest workload
# (trees-long: 0.6 GB peak at 16384, 2.1 GB at 65536, 8 GB at 10**6), so 16384 stays near 0.6 GB.
MAX_N = 16384
# A queue through the simulator (`auction --simulate`): 1024 requests take about 1 s, and time
# grows about linearly, so the largest queue stays within about 20 s.
MAX_QUEUE = MAX_N
MAX_USERS = 16384  # bidders; more users than requests is allowed but buys nothing
MAX_SEED = 2**32 - 1
MAX_TOP = 1000
# The measured hold of `sim run`, simulated seconds after the 10 s warm-up. With the topology and
# concurrency limits (cluster.sim.profile), the worst case (16P/32D, C = 1024, 300 s) keeps
# 138k finished requests: 2.2 GB and 41 s measured; the default point takes under a second.
MIN_HOLD_S = 1.0
MAX_HOLD_S = 300.0

M = TypeVar("M", bound=StrictModel)


class UsageError(ValueError):
    """A bad command-line value; each line of the message names its flag."""


def writable_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and write a probe file in it, so a run that would fail at
    the end on an unwritable folder fails before it starts instead."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as exc:
        raise ValueError(f"must be a folder that can be written ({exc.strerror})") from None
    return path


class _Output(StrictModel):
    """What every long-running subcommand shares: bars on a terminal, ``quiet`` wins."""

    progress: bool | None = None
    quiet: bool = False


class DemoOptions(_Output):
    sim: bool = False
    out: Annotated[Path, Field(strict=False), AfterValidator(writable_dir)] = Path("results/demo")
    n: int = Field(default=1024, ge=1, le=MAX_N)
    users: int = Field(default=128, ge=1, le=MAX_USERS)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)


_MIXSHARE = re.compile(r"mixshare-(\d+(?:\.\d+)?)")
WORKLOADS_HELP = "mixshare-P (P% of queries share a prefix, P from 0 to 100), " + ", ".join(
    k for k in GENERATORS if k != "stars"
)


class AuctionOptions(_Output):
    """``n`` is the batch size; ``queue`` (Q, default n: one batch) the requests that wait, cut
    into batches of n in arrival order. ``simulate`` puts the queue through the simulator
    (``cluster.sim.auction_queue``: one h100-32b worker; ~1 s at Q = 1024)."""

    workload: str = "mixshare-50"
    scheduler: str = "dfs-bid"
    n: int = Field(default=256, ge=1, le=MAX_N)
    queue: int | None = Field(default=None, ge=1, le=MAX_QUEUE)
    users: int = Field(default=32, ge=1, le=MAX_USERS)
    value_model: Literal["iid", "correlated", "one-cluster"] = "iid"
    rho: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    simulate: bool = False
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    top: int = Field(default=5, ge=0, le=MAX_TOP)

    @field_validator("rho")
    @classmethod
    def _rho_needs_correlated(cls, rho: float, info: ValidationInfo) -> float:
        model = info.data.get("value_model")
        if rho != 0.0 and model is not None and model != "correlated":
            raise ValueError(f"applies to --value-model correlated only, not {model}")
        return rho

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, name: str) -> str:
        share = _MIXSHARE.fullmatch(name)
        if share and 0 <= float(share[1]) <= 100:
            return name
        if name in GENERATORS and name != "stars":
            return name
        raise ValueError(f"must be one of {WORKLOADS_HELP}")

    @field_validator("scheduler")
    @classmethod
    def _known_scheduler(cls, name: str) -> str:
        if name not in SCHEDULERS:
            raise ValueError(f"must be one of {', '.join(sorted(SCHEDULERS))}")
        return name


def _known_profile(name: str) -> str:
    known = available_profiles()
    if name not in known:
        raise ValueError(f"must be one of {', '.join(known)}")
    return name


Profile = Annotated[str, AfterValidator(_known_profile)]


class SimRunOptions(_Output):
    profile: Profile = "b200-llama70b-fp8-tp4"
    # None: the profile's default_topology (one aggregated GPU for h100-32b, not the 70B study's)
    topology: Annotated[str, AfterValidator(normalise_topology)] | None = None
    concurrency: int = Field(default=64, ge=1, le=MAX_CONCURRENCY)
    seconds: float = Field(default=40.0, ge=MIN_HOLD_S, le=MAX_HOLD_S)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)


class SimCalibrateOptions(_Output):
    profile: list[Profile] | None = None  # None: every profile


def _npz(path: Path) -> Path:
    if path.suffix != ".npz":
        raise ValueError("must name an .npz file")
    writable_dir(path.parent if str(path.parent) else Path("."))
    return path


class SimExportOptions(StrictModel):
    profile: Profile = "b200-llama70b-fp8-tp4"
    out: Annotated[Path, Field(strict=False), AfterValidator(_npz)]


# ---- from argparse, errors by flag ------------------------------------------------------------

_BRIEF = {
    "finite_number": "must be a finite number",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "int_type": "must be an integer",
    "float_type": "must be a number",
}


def _shown(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # nan, inf: what the user typed, not repr noise
    if isinstance(value, Path):
        return repr(str(value))
    return repr(value) if isinstance(value, str) else str(value)


def describe_flags(exc: ValidationError) -> str:
    """``--flag message, got value``, one line per failed field."""
    lines = []
    for err in exc.errors(include_url=False):
        name = next((p for p in err["loc"] if isinstance(p, str)), "")
        flag = "--" + name.replace("_", "-") if name else "arguments"
        template = _BRIEF.get(err["type"])
        message = template.format(**err.get("ctx", {})) if template else err["msg"]
        message = message.removeprefix("Value error, ")
        lines.append(f"{flag} {message}, got {_shown(err.get('input'))}")
    return "\n".join(lines)


def from_args(model: type[M], args: argparse.Namespace | dict[str, Any]) -> M:
    """``model`` from the parsed flags it names; :class:`UsageError` names every bad flag."""
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    values = {k: v for k, v in given.items() if k in model.model_fields}
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise UsageError(describe_flags(exc)) from None
