"""``controller``: the controller against static splits and Dynamo's planner on production traces,
in our simulator and in Dynamo's replay (docs/design.md §4 "A re-split plans from the traffic";
the runs are ``bench.controller``'s). Needs the Dynamo backend (``make dynamo``) and, for the
planner's arm, ``make planner``, so ``all`` leaves it out: ``disaggctl experiment controller``.

Each trace's first 1,200 s at the speed-up where 1P/5D saturates (1.3 × its capacity in our
simulator, [18]'s choice), six Llama-3.1-70B B200 TP4 workers: every split 1P/5D … 5P/1D at
τ 0 ω 1 and at the study's saturated (τ 0.8, ω 0.1) in both simulators; in ours the study's
table and routing by measured effect on every split; from 1P/5D, ours routing + re-split and
Dynamo's planner (its throughput and latency targets; in ours it sizes the pools through
``cluster.sim.scaling``) in both, and ours again on engines that switch role without a restart
(the profile's ``kv_both_switch_s``). Both controllers plan
for the goodput's SLO (TTFT ≤ 2 s, ITL ≤ 50 ms, at 99%). Seeds vary our simulator's prompt
synthesis; Dynamo's replay is not seeded and runs once per seed too, so its errors are its own
repeatability.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from disaggctl.experiment import plots
from disaggctl.experiment.base import Plan, Settings
from disaggctl.experiment.checks import same_run_of
from disaggctl.experiment.fanout import Job, bench_module
from disaggctl.experiment.report import Section, markdown_table, stat_cell, write_csv
from disaggctl.experiment.stats import fmt, fmt_mean_se, ratio_of_means, summarise
from disaggctl.experiment.traces import SHARED

NAME = "controller"
TITLE = "controller: the re-split against static splits and Dynamo's planner"
# A unit is one virtual second of our simulator's replay (Dynamo's replays are ~100× faster).
SECONDS_PER_UNIT = 0.012
KEYS = ("ttft_p50_s", "ttft_p99_s", "goodput", "worker_s", "moves")
QUICK_WINDOW_S, WINDOW_S = 240.0, 1200.0
TIE = 0.02  # two arms within 2% at P99 are told apart by no verdict here


def plan(settings: Settings) -> Plan:
    B = bench_module("controller")
    window = QUICK_WINDOW_S if settings.quick else WINDOW_S
    folder = Path(settings.traces) if settings.traces else SHARED
    traces: dict[str, Any] = {}
    jobs: list[Job] = []
    for name, (file, speedup) in B.TRACES.items():
        path = str(folder / file)
        theta = B.thresholds(path)
        traces[name] = {"file": file, "speed-up": speedup, "thresholds θ1, θ2 (s)": theta}
        for seed in settings.seeds:
            for sim, arm, topology in B.arms():
                kwargs: dict[str, Any] = {
                    "trace": path, "window_s": window, "speedup": speedup, "arm": arm,
                    "topology": topology, "theta": theta,
                }  # fmt: skip
                if sim == "ours":
                    jobs.append(Job("bench.controller:run_ours", {**kwargs, "seed": seed},
                                    units=window / speedup))  # fmt: skip
                else:
                    jobs.append(Job("bench.controller:run_dynamo", {**kwargs, "seed": seed},
                                    units=window / speedup / 100))  # fmt: skip
    setup = {
        "profile": B.PROFILE,
        "workers": B.WORKERS,
        "window (trace s, from the start)": window,
        "splits": list(B.STATIC),
        "static policies": list(B.POLICIES),
        "SLO both controllers plan for": f"TTFT ≤ {B.SLA_TTFT_S:g} s, ITL ≤ "
        f"{B.SLA_ITL_S * 1000:g} ms, at {B.SLA_ATTAINMENT:.0%}",
        "goodput": "share of requests with TTFT ≤ 2 s and mean ITL ≤ 50 ms",
        "trials (seeds)": list(settings.seeds),
        "traces": traces,
    }
    return Plan(setup, jobs)


def analyse(plan: Plan, results: list[Any]) -> dict[str, Any]:
    B = bench_module("controller")
    runs: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for job, res in zip(plan.jobs, results, strict=True):
        k = job.kwargs
        trace = next(n for n, (f, _) in B.TRACES.items() if k["trace"].endswith(f))
        sim = "ours" if job.fn.endswith("run_ours") else "dynamo"
        runs.setdefault((trace, sim, B.arm_key(k["arm"], k["topology"])), {})[k["seed"]] = res
    out: dict[str, Any] = {}
    for trace in B.TRACES:
        out[trace] = {}
        for sim in ("ours", "dynamo"):
            arms = {a: by_seed for (t, s, a), by_seed in runs.items() if (t, s) == (trace, sim)}
            out[trace][sim] = _rows(arms)
    return out


def _rows(arms: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """Per arm: means ± errors, its ratios (paired by seed) to the hindsight-best static arm,
    to static τ 0 ω 1 on its split and to Dynamo's planner, and the arm whose run it is."""
    seeds = sorted({s for by_seed in arms.values() for s in by_seed})
    trials = {a: [arms[a].get(s, {}) for s in seeds] for a in arms}
    p99 = {a: [t.get("ttft_p99_s") for t in ts] for a, ts in trials.items()}
    statics = [a for a in arms if a.startswith("static:")]
    best = min(statics, key=lambda a: sum(x for x in p99[a] if x is not None) / len(seeds))
    same = same_run_of(trials, KEYS)
    rows = {}
    for arm, ts in trials.items():
        row: dict[str, Any] = dict(summarise(ts, KEYS))
        row["over_best"] = ratio_of_means(p99[arm], p99[best])
        split = arm.rsplit(" ", 1)[-1] if " " in arm and "/" in arm else "1P/5D"
        row["over_affinity"] = ratio_of_means(p99[arm], p99[f"static:0,1 {split}"])
        if "dynamo planner" in p99:
            row["over_planner"] = ratio_of_means(p99[arm], p99["dynamo planner"])
            goods = [t.get("goodput") for t in ts]
            planner = [t.get("goodput") for t in trials["dynamo planner"]]
            row["goodput_over_planner"] = ratio_of_means(goods, planner)
        row["same_as"] = same.get(arm)
        row["missing"] = next((t["missing"] for t in ts if "missing" in t), None)
        rows[arm] = row
    return {"best": best, "rows": rows}


NAMED = (  # the arms, in its order: (label, the arm's key)
    ("starting split, static τ 0 ω 1", "static:0,1 1P/5D"),
    ("the study's table from 1P/5D", "study table 1P/5D"),
    ("Dynamo's planner from 1P/5D", "dynamo planner"),
    ("Dynamo's planner, latency target, from 1P/5D", "dynamo planner (latency)"),
    ("ours routing only from 1P/5D", "ours routing 1P/5D"),
    ("ours routing + re-split from 1P/5D", "ours routing+resplit"),
    ("ours routing + re-split, kv_both switch, from 1P/5D", "ours routing+resplit (kv_both)"),
)
KV_BOTH = NAMED[-1][1]  # the kv_both arm: bench.controller.KV_BOTH


def _named(part: dict[str, Any]) -> list[tuple[str, str]]:
    best = part["best"]
    return [
        ("hindsight-best static: " + best, best),
        *((label, k) for label, k in NAMED if k in part["rows"]),
    ]


def _cell(pair: tuple[float | None, float | None] | None) -> str:
    return "–" if pair is None else fmt_mean_se(*pair)


def report(data: dict[str, Any], setup: dict[str, Any], folder: Path, section: Section) -> None:
    header = ("simulator", "arm", "TTFT P50 s", "TTFT P99 s", "goodput share", "worker-s",
              "moves", "P99 / best static ratio", "P99 / planner ratio")  # fmt: skip
    flat = []
    for trace, sims in data.items():
        rows = []
        for sim, part in sims.items():
            for label, key in _named(part):
                r = part["rows"][key]
                if r["missing"]:
                    rows.append((sim, label, r["missing"], "", "", "", "", "", ""))
                    continue
                if r["same_as"]:
                    rows.append((sim, label, f"the run of {r['same_as']}", "", "", "", "", "", ""))
                    continue
                rows.append((
                    sim, label, stat_cell(r, "ttft_p50_s"), stat_cell(r, "ttft_p99_s"),
                    stat_cell(r, "goodput"), stat_cell(r, "worker_s", digits=5),
                    stat_cell(r, "moves", digits=2), _cell(r["over_best"]),
                    _cell(r.get("over_planner")),
                ))  # fmt: skip
            for key, r in part["rows"].items():
                plain = {k: v for k, v in r.items() if not isinstance(v, tuple)}
                flat.append({"trace": trace, "simulator": sim, "arm": key, **plain})
        spec = setup["traces"][trace]
        section.text(f"**{trace}** (×{spec['speed-up']:g}; θ1, θ2 = "
                     f"{', '.join(fmt(x) for x in spec['thresholds θ1, θ2 (s)'])} s):\n\n"
                     + markdown_table(header, rows))  # fmt: skip
        section.text(_routing_table(sims["ours"]))
        section.text(_verdict(trace, sims))
    write_csv(folder / "controller.csv", flat)
    plot_p99(data, folder / "controller_p99.png")
    section.figure(
        "controller_p99.png",
        "TTFT P99 of the issue's arms, both simulators, both traces",
        "Bars: mean TTFT P99 over the seeds (log scale); the hindsight-best static split is the "
        "best of ten fixed (split, policy) arms, chosen after the fact.",
    )


def _routing_table(ours: dict[str, Any]) -> str:
    B = bench_module("controller")
    header = ("split", "static τ 0.8 ω 0.1 / static", "study table / static",
              "ours routing / static")  # fmt: skip
    rows = []
    for t in B.STATIC:
        cells = []
        for key in (f"static:0.8,0.1 {t}", f"study table {t}", f"ours routing {t}"):
            r = ours["rows"][key]
            cells.append(
                f"the run of {r['same_as']}" if r["same_as"] else _cell(r["over_affinity"])
            )
        rows.append((t, *cells))
    title = "Routing on each split in our simulator, TTFT P99 over static τ 0 ω 1 on that split"
    return f"{title}:\n\n" + markdown_table(header, rows)


def _verdict(trace: str, sims: dict[str, Any]) -> str:
    """Where ours wins and loses, from the figures."""
    parts = []
    for sim, part in sims.items():
        rows = part["rows"]
        mine = rows["ours routing+resplit"]
        best = part["best"]
        over = mine["over_best"][0]
        line = (
            f"In {sim}, ours routing + re-split reads TTFT P99 {fmt(mine['ttft_p99_s'])} s, "
            f"{fmt(over)}× the hindsight-best static ({best}, "
            f"{fmt(rows[best]['ttft_p99_s'])} s)"
        )
        start = rows["static:0,1 1P/5D"]
        line += f" and {fmt(mine['ttft_p99_s'] / start['ttft_p99_s'])}× the starting split's"
        if "dynamo planner" in rows and not rows["dynamo planner"]["missing"]:
            plan_ = rows["dynamo planner"]
            line += (f"; against Dynamo's planner {fmt(mine['over_planner'][0])}× at P99, goodput "
                     f"{fmt(mine['goodput'])} against {fmt(plan_['goodput'])}, on "
                     f"{fmt(mine['worker_s'], 4)} worker-s against the planner's "
                     f"{fmt(plan_['worker_s'], 4)}")  # fmt: skip
        parts.append(line + ".")
        parts.append(_wins_and_losses(part))
        kv_both = rows.get(KV_BOTH)
        if kv_both and not kv_both["missing"]:
            parts.append(
                f"On engines that switch role without a restart (kv_both) it reads "
                f"{fmt(kv_both['ttft_p99_s'])} s, {fmt(kv_both['over_best'][0])}× the "
                f"hindsight-best static."
            )
    ours = sims["ours"]["rows"]
    effects = {
        t: ours[f"ours routing {t}"]["over_affinity"][0] for t in bench_module("controller").STATIC
    }
    worst = max(effects.items(), key=lambda kv: kv[1] or 0.0)
    best = min(effects.items(), key=lambda kv: kv[1] or 9.0)
    gain = "nowhere" if (best[1] or 1.0) > 0.9 else f"on {best[0]} ({fmt(best[1])}×)"
    parts.append(f"Routing only: at worst {fmt(worst[1])}× static τ 0 ω 1 ({worst[0]}); 10% "
                 f"better {gain}.")  # fmt: skip
    return f"{trace}: " + " ".join(parts)


def _wins_and_losses(part: dict[str, Any]) -> str:
    """Which of the issue's other arms ours (routing + re-split) beats at mean TTFT P99, and
    which beat it (a ratio within ``TIE`` of 1 is neither)."""
    mine = part["rows"]["ours routing+resplit"]["ttft_p99_s"]
    wins: list[str] = []
    losses: list[str] = []
    ties: list[str] = []
    for label, key in _named(part):
        theirs = part["rows"][key]["ttft_p99_s"]
        if key in ("ours routing+resplit", KV_BOTH) or part["rows"][key]["missing"] or not theirs:
            continue
        ratio = mine / theirs
        named = f"{label.replace(' from 1P/5D', '')} ({fmt(ratio)}×)"
        (ties if abs(ratio - 1) <= TIE else wins if ratio < 1 else losses).append(named)
    text = (
        f"It beats {', '.join(wins) or 'none of them'}; it loses to {', '.join(losses) or 'none'}"
    )
    return text + (f"; it ties {', '.join(ties)}." if ties else ".")


def plot_p99(data: dict[str, Any], path: Path) -> Path:
    fig, axes = plots.plt.subplots(1, len(data), figsize=(6 * len(data), 4.5), squeeze=False)
    for ax, (trace, sims) in zip(axes[0], data.items(), strict=True):
        labels: list[str] = []
        for k, (sim, part) in enumerate(sims.items()):
            named = [(a, key) for a, key in _named(part) if not part["rows"][key]["missing"]]
            xs = [i + 0.4 * k for i in range(len(named))]
            ys = [part["rows"][key]["ttft_p99_s"] or 0.0 for _, key in named]
            ax.bar(xs, ys, width=0.4, color=f"C{k}", label=sim)
            labels = labels or [a.split(":")[0].replace(" from 1P/5D", "") for a, _ in named]
        ax.set_xticks([i + 0.2 for i in range(len(labels))], labels, rotation=30, ha="right",
                      fontsize=7)  # fmt: skip
        ax.set_yscale("log")
        ax.set_ylabel("TTFT P99 (s)")
        ax.set_title(trace)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return plots.save(fig, path)
