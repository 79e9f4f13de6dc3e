"""Seeded, token-level workload generators for the auction and the simulator (docs/design.md §8).

Three tree shapes, each a batch of ``auction.Request`` with token ids in [0, vocab); every length
is a parameter, with defaults that give the shapes of the study (measured at n = 1024, seed 0,
in ``tests/cluster/test_workloads.py``):

- ``stars`` (``mixshare-P``): P% of the queries are one of ``articles`` ~1k-token articles (or
  few-shot prefixes) followed by a short question; the rest are singletons: a question of the
  same length with no article. mixshare-50 shares 88% of its tokens, mixshare-90 93%,
  mixshare-10 59%. Four articles fit any cache; ``mixshare-P-wide`` has 64 (~64k tokens of
  prefixes), more than the 23k-token cache of ``h100-32b``.
- ``chains``: agent trajectories. A trajectory starts from a shared system prompt and a task, and
  every step's prompt extends the previous one by an observation: prompts from ~2.2k to ~4k
  tokens, ~3.1k on average; 88% shared.
- ``trees``: tree-of-thought, ``branching``-ary (3) of ``depth`` 3. Every thought's prompt is the
  question plus the thoughts on its path. ``short`` (~160 tokens at the leaves, ~20k distinct
  tokens in 1024 requests) fits the 23k-token cache of ``h100-32b``; ``long`` (~4k tokens, ~360k
  distinct) does not.

Jitter: article, question and tree-question lengths vary uniformly by ±10%, every other run
(question, task, step, thought) by ±25%, so prompts are not all alike.

Values are v = 1 + Pareto(1.5), i.e. a Pareto law with scale 1 and tail index 1.5 (heavy-tailed:
a few requests are worth far more than the rest), drawn by a ``ValueModel``: i.i.d., correlated
within clusters (the requests of one article, trajectory or problem) with Gaussian-copula
correlation ρ, or one bidding cluster with everyone else at zero. Requests arrive in a random
interleaving; users are drawn at random per request; bids are the values (truthful bidders).
Every request generates ``output_tokens`` tokens when simulated (``Workload.sim_requests``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from auction import Request
from cluster.values import PARETO_SHAPE, VALUE_KINDS, ValueModel, pareto_values

__all__ = [
    "DEFAULT_WORKLOADS",
    "GENERATORS",
    "OUTPUT_TOKENS",
    "PARETO_SHAPE",
    "TREE_SIZES",
    "VALUE_KINDS",
    "ValueModel",
    "Workload",
    "chains",
    "make_workload",
    "output_length_range",
    "pareto_values",
    "stars",
    "trees",
]
if TYPE_CHECKING:
    from cluster.sim.request import SimRequest

VOCAB = 32_000
OUTPUT_TOKENS = 32  # generated per request: short answers, so the queue's TTFT is prefill-bound


def output_length_range(mean: int, ratio: float, *, name: str = "ratio") -> tuple[int, int]:
    """The output lengths drawn around ``mean`` = L: the integers in [L(1 − r), L(1 + r)],
    r = ``ratio`` (vLLM's serving benchmark, ``--random-range-ratio``), at least 1; (L, L) at
    r = 0. A bad r is refused naming ``name``, the caller's setting."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {ratio}")
    return max(1, round(mean * (1.0 - ratio))), round(mean * (1.0 + ratio))


TokenArray = npt.NDArray[np.uint32]
FloatArray = npt.NDArray[np.float64]
Knob = int | float | str


@dataclass(frozen=True)
class Workload:
    """A named batch and the facts about its sharing that experiments report.

    ``clusters[k]`` labels the unit request k belongs to (its article, trajectory or problem;
    singletons are clusters of one). ``knobs`` records every parameter the generator used (for
    the report's setup); ``output_tokens`` is what each request generates when simulated."""

    name: str
    requests: tuple[Request, ...]
    seed: int
    clusters: tuple[int, ...] = ()
    output_tokens: int = OUTPUT_TOKENS
    knobs: Mapping[str, Knob] = field(default_factory=dict, hash=False)

    @property
    def total_tokens(self) -> int:
        """M: prompt tokens over all requests."""
        return sum(len(r) for r in self.requests)

    @property
    def distinct_tokens(self) -> int:
        """Tokens a cache must hold to keep every prompt: each shared prefix once."""
        from auction import build_radix_tree  # the tree is the exact count of unique prefixes

        return build_radix_tree(self.requests).tree_tokens

    @property
    def shared_prefix_tokens(self) -> int:
        """Tokens of the prefixes two or more prompts share (each once): what a cache must hold
        for every order of the batch to find them, the rest being read once whatever the order."""
        from auction import build_radix_tree

        tree = build_radix_tree(self.requests)
        edges = tree.depth[1:] - tree.depth[tree.parent[1:]]
        return int(edges[tree.size[1:] >= 2].sum())

    @property
    def shared_fraction(self) -> float:
        """Fraction of prompt tokens that a prefix cache holding everything would not recompute."""
        total = self.total_tokens
        return 0.0 if total == 0 else 1.0 - self.distinct_tokens / total

    @property
    def mean_prompt_tokens(self) -> float:
        return self.total_tokens / len(self.requests) if self.requests else 0.0

    @property
    def values(self) -> npt.NDArray[np.float64]:
        return np.array([r.bid for r in self.requests], dtype=np.float64)

    def sim_requests(self) -> list[SimRequest]:
        """The batch as simulator requests in arrival order, ``output_tokens`` each."""
        from cluster.sim.request import sim_requests

        return sim_requests(self.requests, self.output_tokens)


def _tokens(rng: np.random.Generator, length: int) -> TokenArray:
    return rng.integers(0, VOCAB, size=max(1, int(length)), dtype=np.uint32)


def _jitter(rng: np.random.Generator, mean: int, spread: float = 0.25) -> int:
    return max(1, round(mean * rng.uniform(1.0 - spread, 1.0 + spread)))


def _check_lengths(**lengths: int) -> None:
    for name, value in lengths.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def _assemble(
    name: str,
    prompts: list[TokenArray],
    clusters: list[int],
    knobs: Mapping[str, Knob],
    rng: np.random.Generator,
    users: int,
    seed: int,
    values: ValueModel | None,
    output_tokens: int,
) -> Workload:
    """Shuffle arrivals, give each request a user at random and draw values."""
    n = len(prompts)
    if users < 1:
        raise ValueError(f"users must be >= 1, got {users}")
    _check_lengths(output_tokens=output_tokens)
    arrival = rng.permutation(n)
    user_of = rng.integers(0, users, size=n)
    labels = np.asarray(clusters, dtype=np.int64)
    model = values or ValueModel()
    drawn = model.draw(rng, labels)
    requests = tuple(
        Request(
            id=f"{name}-{k}",
            user=f"user{int(user_of[k])}",
            tokens=prompts[k],
            bid=float(drawn[k]),
            arrival=int(arrival[k]),
        )
        for k in range(n)
    )
    return Workload(
        name=name,
        requests=requests,
        seed=seed,
        clusters=tuple(clusters),
        output_tokens=output_tokens,
        knobs={
            **knobs,
            "n": n,
            "users": users,
            "output_tokens": output_tokens,
            "values": model.label,
        },
    )


def stars(
    n: int,
    share_pct: float = 50.0,
    *,
    users: int = 128,
    articles: int = 4,
    prefix_tokens: int = 1024,
    question_tokens: int = 64,
    singleton_tokens: int = 64,
    output_tokens: int = OUTPUT_TOKENS,
    seed: int = 0,
    values: ValueModel | None = None,
) -> Workload:
    """``mixshare-P``: ``share_pct`` % of queries are one of ``articles`` prefixes of
    ~``prefix_tokens`` plus a question of ~``question_tokens``; the rest are singletons of
    ~``singleton_tokens`` that share nothing (a question with no article). A question and a
    singleton draw the same random numbers, so one seed gives the same values, arrivals and
    users at every P: a sweep over P changes the sharing and nothing else."""
    if not 0.0 <= share_pct <= 100.0:
        raise ValueError(f"share_pct must lie in [0, 100], got {share_pct}")
    _check_count(n)
    _check_lengths(
        articles=articles,
        prefix_tokens=prefix_tokens,
        question_tokens=question_tokens,
        singleton_tokens=singleton_tokens,
    )
    rng = np.random.default_rng(seed)
    shared = round(n * share_pct / 100.0)
    heads = [_tokens(rng, _jitter(rng, prefix_tokens, 0.1)) for _ in range(articles)]
    prompts: list[TokenArray] = []
    clusters: list[int] = []
    for k in range(n):
        if k < shared:
            head = heads[k % articles]
            prompts.append(np.concatenate((head, _tokens(rng, _jitter(rng, question_tokens)))))
            clusters.append(k % articles)
        else:
            prompts.append(_tokens(rng, _jitter(rng, singleton_tokens)))
            clusters.append(articles + k)
    knobs: dict[str, Knob] = {
        "share_pct": share_pct,
        "articles": articles,
        "prefix_tokens": prefix_tokens,
        "question_tokens": question_tokens,
        "singleton_tokens": singleton_tokens,
    }
    return _assemble(
        f"mixshare-{share_pct:g}", prompts, clusters, knobs, rng, users, seed, values, output_tokens
    )


def chains(
    n: int,
    *,
    users: int = 128,
    steps: int = 8,
    system_tokens: int = 1024,
    task_tokens: int = 896,
    step_tokens: int = 256,
    output_tokens: int = OUTPUT_TOKENS,
    seed: int = 0,
    values: ValueModel | None = None,
) -> Workload:
    """Agent trajectories of ``steps`` requests: a shared system prompt, the trajectory's task,
    then one observation of ~``step_tokens`` per step, each prompt extending the last. With the
    defaults prompts run from ~2.2k to ~4k tokens, ~3.1k on average."""
    _check_count(n)
    _check_lengths(
        steps=steps, system_tokens=system_tokens, task_tokens=task_tokens, step_tokens=step_tokens
    )
    rng = np.random.default_rng(seed)
    system = _tokens(rng, system_tokens)
    prompts: list[TokenArray] = []
    clusters: list[int] = []
    trajectory = 0
    while len(prompts) < n:
        prompt = np.concatenate((system, _tokens(rng, _jitter(rng, task_tokens))))
        for _ in range(min(steps, n - len(prompts))):
            prompt = np.concatenate((prompt, _tokens(rng, _jitter(rng, step_tokens))))
            prompts.append(prompt)
            clusters.append(trajectory)
        trajectory += 1
    knobs: dict[str, Knob] = {
        "steps": steps,
        "system_tokens": system_tokens,
        "task_tokens": task_tokens,
        "step_tokens": step_tokens,
    }
    return _assemble("chains", prompts, clusters, knobs, rng, users, seed, values, output_tokens)


# (question tokens, tokens per thought). Short: 112 + 3·16 = 160 at the leaves, and each of the
# 1024 requests adds one ~16-token thought, so the whole queue holds ~20k distinct tokens: within
# the 23k-token cache of h100-32b. Long: 3200 + 3·270 ≈ 4k at the leaves.
TREE_SIZES = {"short": (112, 16), "long": (3200, 270)}


def trees(
    n: int,
    size: str = "short",
    *,
    users: int = 128,
    branching: int = 3,
    depth: int = 3,
    question_tokens: int | None = None,
    thought_tokens: int | None = None,
    output_tokens: int = OUTPUT_TOKENS,
    seed: int = 0,
    values: ValueModel | None = None,
) -> Workload:
    """Tree-of-thought problems: every thought of a ``branching``-ary tree of ``depth`` levels is
    a request whose prompt is the question plus the thoughts on its path. ``size`` picks the
    default question and thought lengths (``TREE_SIZES``); either may be given instead."""
    _check_count(n)
    if size not in TREE_SIZES:
        raise ValueError(f"size must be one of {sorted(TREE_SIZES)}, got {size!r}")
    default_question, default_thought = TREE_SIZES[size]
    question = default_question if question_tokens is None else question_tokens
    thought = default_thought if thought_tokens is None else thought_tokens
    _check_lengths(
        branching=branching, depth=depth, question_tokens=question, thought_tokens=thought
    )
    rng = np.random.default_rng(seed)
    prompts: list[TokenArray] = []
    clusters: list[int] = []
    problem = 0
    while len(prompts) < n:
        frontier = [_tokens(rng, _jitter(rng, question, 0.1))]
        for _ in range(depth):
            if len(prompts) >= n:
                break  # the last problem is cut short: no thoughts nobody will ask for
            frontier = [
                np.concatenate((parent, _tokens(rng, _jitter(rng, thought))))
                for parent in frontier
                for _ in range(branching)
            ]
            take = frontier[: n - len(prompts)]
            prompts.extend(take)
            clusters.extend([problem] * len(take))
        problem += 1
    knobs: dict[str, Knob] = {
        "branching": branching,
        "depth": depth,
        "question_tokens": question,
        "thought_tokens": thought,
    }
    return _assemble(
        f"trees-{size}", prompts, clusters, knobs, rng, users, seed, values, output_tokens
    )


def _check_count(n: int) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")


GENERATORS: dict[str, Callable[..., Workload]] = {
    "stars": stars,
    "chains": chains,
    "trees-short": lambda n, **kw: trees(n, "short", **kw),
    "trees-long": lambda n, **kw: trees(n, "long", **kw),
}

DEFAULT_WORKLOADS = ("mixshare-50", "mixshare-90", "chains", "trees-short", "trees-long")
# ``mixshare-P-wide``: 64 articles of ~1k tokens, ~64k tokens of shared prefixes, against the
# 4 of ``mixshare-P`` (~4k) that every cache the study uses holds whole (h100-32b: 23k tokens).
WIDE_ARTICLES = 64


def make_workload(
    name: str,
    n: int,
    *,
    users: int = 128,
    seed: int = 0,
    values: ValueModel | None = None,
    **knobs: Knob,
) -> Workload:
    """A workload by name: ``mixshare-P`` (e.g. ``mixshare-50``), ``chains``, ``trees-short``,
    ``trees-long``. ``knobs`` go to the generator (``stars``, ``chains``, ``trees``); an unknown
    one is a ``ValueError`` naming it."""
    if name.startswith("mixshare-"):
        spec, wide = name.removeprefix("mixshare-"), name.endswith("-wide")
        try:
            share = float(spec.removesuffix("-wide"))
        except ValueError:
            raise ValueError(
                f"bad workload {name!r}: expected mixshare-P or mixshare-P-wide, P in [0, 100]"
            ) from None
        if wide:  # more shared prefix tokens than a small worker's cache holds
            knobs = {"articles": WIDE_ARTICLES, **knobs}
        generator: Callable[..., Workload] = lambda n, **kw: stars(n, share, **kw)  # noqa: E731
    elif name in GENERATORS and name != "stars":
        generator = GENERATORS[name]
    else:
        known = "mixshare-P, " + ", ".join(k for k in GENERATORS if k != "stars")
        raise ValueError(f"unknown workload {name!r}; known: {known}")
    try:
        return generator(n, users=users, seed=seed, values=values, **knobs)
    except TypeError as exc:  # an unknown knob: say which, not a Python signature error
        raise ValueError(f"workload {name!r}: {exc}") from None
