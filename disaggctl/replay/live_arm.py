"""``disaggctl replay --live URL``: the trace against a running service, as one arm of the report.

The requests are the simulator's (the same window, prompts from the same seed); the figures
come from the client's side of each stream (``disaggctl.replay.live``), the ticks from the
service's metrics server when ``--metrics`` names it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from cluster.progress import progress_bar
from disaggctl.jsonout import strict_dumps
from disaggctl.replay.live import LiveRun, lateness_summary, replay_live
from disaggctl.replay.outcome import ArmOutcome, latency_summary, write_jsonl
from disaggctl.replay.sim_arm import open_trace

if TYPE_CHECKING:
    from disaggctl.replay.cli import ReplayOptions

__all__ = ["live_outcome", "run_live_arm", "served_model"]


def served_model(base_url: str, api_key: str | None = None) -> str:
    """The first model ``GET /v1/models`` lists."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        listed = httpx.get(f"{base_url.rstrip('/')}/v1/models", headers=headers, timeout=10.0)
        listed.raise_for_status()
        return str(listed.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"no model listed at {base_url}/v1/models ({exc})") from None


def live_outcome(run: LiveRun, out: Path | None, name: str = "live") -> ArmOutcome:
    """The report's view of a live run; with ``out``, its requests and ticks written there."""
    reqs = run.requests
    ok = [r for r in reqs if r.status == 200]

    def nan(x: float | None) -> float:
        return math.nan if x is None else x

    summary: dict[str, Any] = {
        "requests": len(reqs),
        "completed": len(ok),
        **latency_summary(
            [nan(r.ttft_s) for r in ok],
            [nan(r.itl_mean_s) for r in ok],
            [r.e2e_s for r in ok],
        ),
        "throughput_rps": len(ok) / run.seconds if run.seconds > 0 else math.nan,
        "prefix_reuse": (
            sum(r.cached_tokens for r in ok) / max(1, sum(r.prompt_tokens for r in ok))
        ),
        "statuses": {str(k): v for k, v in sorted(Counter(r.status for r in reqs).items())},
        "lateness": lateness_summary(reqs),
        "wall_s": run.seconds,
    }
    files: list[str] = []
    if out is not None:
        requests = out / f"requests-{name}.jsonl"
        write_jsonl(requests, ({**asdict(r), "lateness_s": r.lateness_s} for r in reqs))
        ticks = out / f"ticks-{name}.json"
        ticks.write_text(strict_dumps(run.ticks) + "\n")
        files = [requests.name, ticks.name]
    regimes = {"below": 0, "transition": 1, "saturated": 2}
    return ArmOutcome(
        name=name,
        summary=summary,
        arrival_s=[r.scheduled_s for r in reqs],
        ttft_s=[nan(r.ttft_s) for r in reqs],
        finish_s=[r.sent_s + r.e2e_s if r.status == 200 else math.nan for r in reqs],
        prompt_tokens=[r.prompt_tokens for r in reqs],
        cached_tokens=[r.cached_tokens for r in reqs],
        ticks=[{**t, "regime": regimes.get(str(t.get("regime")))} for t in run.ticks],
        files=files,
    )


def run_live_arm(o: ReplayOptions) -> ArmOutcome:
    """Replay ``o.trace`` against ``o.live`` (the service refuses what its model cannot take:
    a 413 is counted in the statuses, not skipped here)."""
    assert o.live is not None
    reader, requests, prompts = open_trace(o.spec(context_tokens=0) | {"context_tokens": None})
    model = o.model or served_model(o.live, o.api_key)
    with progress_bar(desc="live", unit="req", progress=o.progress, quiet=o.quiet) as bar:

        def moved(sent: int, finished: int) -> None:
            bar.n = finished
            bar.set_postfix_str(f"sent {sent}", refresh=False)
            bar.refresh()

        run = replay_live(
            o.live, requests, prompts, model=model, api_key=o.api_key, metrics_url=o.metrics,
            on_progress=moved,
        )  # fmt: skip
    outcome = live_outcome(run, o.out)
    outcome.summary["trace"] = reader.stats.as_dict()
    return outcome
