"""Seeded, token-level workload generators for the auction and the simulator (docs/design.md §8).

Three tree shapes, each a batch of ``auction.Request`` with token ids in [0, vocab):

- ``stars`` (``mixshare-P``): P% of the queries share one of a few ~1k-token articles (or few-shot
  prefixes) and differ in a short question; the rest are singletons of the same length.
- ``chains``: agent trajectories. A trajectory starts from a shared system prompt and a task, and
  every step's prompt extends the previous one by an observation (~3k tokens by the last step).
- ``trees``: tree-of-thought, 3-ary. Every thought's prompt is the question plus the thoughts on its
  path. ``short`` (~160 tokens at the leaves) fits a KV cache, ``long`` (~4k tokens) does not.

Values are v = 1 + Pareto(1.5), i.e. a Pareto law with scale 1 and tail index 1.5 (heavy-tailed:
a few requests are worth far more than the rest), drawn by a ``ValueModel``: i.i.d., correlated
within clusters (the requests of one article, trajectory or problem) with Gaussian-copula
correlation ρ, or one bidding cluster with everyone else at zero. Requests arrive in a random
interleaving; users are drawn at random per request; bids are the values (truthful bidders).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr

from auction import Request

if TYPE_CHECKING:
    from cluster.sim.cluster import SimRequest

VOCAB = 32_000
PARETO_SHAPE = 1.5

TokenArray = npt.NDArray[np.uint32]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ValueModel:
    """How request values are drawn: ``iid``, ``correlated`` (ρ within a cluster) or
    ``one-cluster`` (the largest cluster bids, the rest value nothing)."""

    kind: str = "iid"
    rho: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("iid", "correlated", "one-cluster"):
            raise ValueError(f"value model must be iid, correlated or one-cluster: {self.kind!r}")
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"rho must lie in [0, 1], got {self.rho}")

    def draw(self, rng: np.random.Generator, clusters: npt.NDArray[np.int64]) -> FloatArray:
        n = clusters.shape[0]
        if self.kind == "iid" or n == 0:
            return pareto_values(rng, n)
        if self.kind == "one-cluster":
            largest = int(np.argmax(np.bincount(clusters)))
            return np.where(clusters == largest, pareto_values(rng, n), 0.0)
        # Gaussian copula: z = √ρ·z_cluster + √(1−ρ)·ε keeps each marginal Pareto(1.5) exactly.
        shared = rng.standard_normal(int(clusters.max()) + 1)[clusters]
        z = np.sqrt(self.rho) * shared + np.sqrt(1.0 - self.rho) * rng.standard_normal(n)
        u = ndtr(z)
        return np.asarray((1.0 - u) ** (-1.0 / PARETO_SHAPE), dtype=np.float64)


@dataclass(frozen=True)
class Workload:
    """A named batch and the facts about its sharing that experiments report.

    ``clusters[k]`` labels the unit request k belongs to (its article, trajectory or problem;
    singletons are clusters of one)."""

    name: str
    requests: tuple[Request, ...]
    seed: int
    clusters: tuple[int, ...] = ()

    @property
    def total_tokens(self) -> int:
        """M: prompt tokens over all requests."""
        return sum(len(r) for r in self.requests)

    @property
    def shared_fraction(self) -> float:
        """Fraction of prompt tokens that a prefix cache holding everything would not recompute."""
        from auction import build_radix_tree  # the tree is the exact count of unique prefixes

        total = self.total_tokens
        return 0.0 if total == 0 else 1.0 - build_radix_tree(self.requests).tree_tokens / total

    @property
    def values(self) -> npt.NDArray[np.float64]:
        return np.array([r.bid for r in self.requests], dtype=np.float64)


def pareto_values(rng: np.random.Generator, size: int) -> npt.NDArray[np.float64]:
    """i.i.d. values 1 + Pareto(1.5) (numpy's ``pareto`` is the Lomax law, hence the 1 +)."""
    return 1.0 + rng.pareto(PARETO_SHAPE, size=size)


def _tokens(rng: np.random.Generator, length: int) -> TokenArray:
    return rng.integers(0, VOCAB, size=max(1, int(length)), dtype=np.uint32)


def _jitter(rng: np.random.Generator, mean: int, spread: float = 0.25) -> int:
    return max(1, round(mean * rng.uniform(1.0 - spread, 1.0 + spread)))


def _assemble(
    name: str,
    prompts: list[TokenArray],
    clusters: list[int],
    *,
    users: int,
    seed: int,
    rng: np.random.Generator,
    values: ValueModel | None,
) -> Workload:
    """Shuffle arrivals, give each request a user at random and draw values."""
    n = len(prompts)
    if users < 1:
        raise ValueError(f"users must be >= 1, got {users}")
    arrival = rng.permutation(n)
    user_of = rng.integers(0, users, size=n)
    labels = np.asarray(clusters, dtype=np.int64)
    drawn = (values or ValueModel()).draw(rng, labels)
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
    return Workload(name=name, requests=requests, seed=seed, clusters=tuple(clusters))


def stars(
    n: int,
    share_pct: float = 50.0,
    *,
    users: int = 128,
    articles: int = 4,
    prefix_tokens: int = 1024,
    question_tokens: int = 64,
    seed: int = 0,
    values: ValueModel | None = None,
) -> Workload:
    """``mixshare-P``: ``share_pct`` % of queries share one of ``articles`` prefixes."""
    if not 0.0 <= share_pct <= 100.0:
        raise ValueError(f"share_pct must lie in [0, 100], got {share_pct}")
    _check_count(n)
    rng = np.random.default_rng(seed)
    shared = round(n * share_pct / 100.0)
    heads = [_tokens(rng, _jitter(rng, prefix_tokens, 0.1)) for _ in range(max(1, articles))]
    prompts: list[TokenArray] = []
    clusters: list[int] = []
    for k in range(n):
        if k < shared:
            head = heads[k % len(heads)]
            prompts.append(np.concatenate((head, _tokens(rng, _jitter(rng, question_tokens)))))
            clusters.append(k % len(heads))
        else:
            prompts.append(_tokens(rng, _jitter(rng, prefix_tokens + question_tokens, 0.1)))
            clusters.append(len(heads) + k)
    name = f"mixshare-{share_pct:g}"
    return _assemble(name, prompts, clusters, users=users, seed=seed, rng=rng, values=values)


def chains(
    n: int,
    *,
    users: int = 128,
    steps: int = 8,
    system_tokens: int = 256,
    task_tokens: int = 256,
    final_tokens: int = 3072,
    seed: int = 0,
    values: ValueModel | None = None,
) -> Workload:
    """Agent trajectories of ``steps`` steps, each prompt extending the last, ~``final_tokens``."""
    _check_count(n)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    rng = np.random.default_rng(seed)
    system = _tokens(rng, system_tokens)
    step_tokens = max(1, (final_tokens - system_tokens - task_tokens) // steps)
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
    return _assemble("chains", prompts, clusters, users=users, seed=seed, rng=rng, values=values)


TREE_SIZES = {"short": (64, 32), "long": (3200, 270)}  # (question tokens, tokens per thought)


def trees(
    n: int,
    size: str = "short",
    *,
    users: int = 128,
    branching: int = 3,
    depth: int = 3,
    seed: int = 0,
    values: ValueModel | None = None,
) -> Workload:
    """Tree-of-thought problems: every thought of a ``branching``-ary tree is a request."""
    _check_count(n)
    if size not in TREE_SIZES:
        raise ValueError(f"size must be one of {sorted(TREE_SIZES)}, got {size!r}")
    question_tokens, thought_tokens = TREE_SIZES[size]
    rng = np.random.default_rng(seed)
    prompts: list[TokenArray] = []
    clusters: list[int] = []
    problem = 0
    while len(prompts) < n:
        frontier = [_tokens(rng, _jitter(rng, question_tokens, 0.1))]
        for _ in range(depth):
            frontier = [
                np.concatenate((parent, _tokens(rng, _jitter(rng, thought_tokens))))
                for parent in frontier
                for _ in range(branching)
            ]
            take = frontier[: n - len(prompts)]
            prompts.extend(take)
            clusters.extend([problem] * len(take))
        problem += 1
    name = f"trees-{size}"
    return _assemble(name, prompts, clusters, users=users, seed=seed, rng=rng, values=values)


def _check_count(n: int) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")


GENERATORS: dict[str, Callable[..., Workload]] = {
    "stars": stars,
    "chains": chains,
    "trees-short": lambda n, **kw: trees(n, "short", **kw),
    "trees-long": lambda n, **kw: trees(n, "long", **kw),
}


def make_workload(
    name: str, n: int, *, users: int = 128, seed: int = 0, values: ValueModel | None = None
) -> Workload:
    """A workload by name: ``mixshare-P`` (e.g. ``mixshare-50``), ``chains``, ``trees-short``,
    ``trees-long``."""
    if name.startswith("mixshare-"):
        try:
            share = float(name.removeprefix("mixshare-"))
        except ValueError:
            raise ValueError(f"bad workload {name!r}: expected mixshare-P, P in [0, 100]") from None
        return stars(n, share, users=users, seed=seed, values=values)
    if name not in GENERATORS or name == "stars":
        known = "mixshare-P, " + ", ".join(k for k in GENERATORS if k != "stars")
        raise ValueError(f"unknown workload {name!r}; known: {known}")
    return GENERATORS[name](n, users=users, seed=seed, values=values)


class TemplateSource:
    """The calibration workload: ``templates`` shared prefixes of ``template_tokens``, each request
    a template plus a unique tail up to ``input_tokens``, then ``output_tokens`` generated.

    Calling it returns the next ``SimRequest`` (templates drawn uniformly, seeded). With
    ``bidders`` ({user: share of requests}), that share of requests belongs to each bidding user
    and carries a bid of 1 + Pareto(1.5); the rest are ``anonymous`` with bid 0.
    """

    def __init__(
        self,
        templates: int = 5,
        template_tokens: int = 64,
        input_tokens: int = 128,
        output_tokens: int = 256,
        *,
        seed: int = 0,
        prefix: str = "req",
        bidders: Mapping[str, float] | None = None,
    ) -> None:
        if templates < 1 or not 0 <= template_tokens <= input_tokens or output_tokens < 1:
            raise ValueError(
                "templates >= 1, 0 <= template_tokens <= input_tokens, output_tokens >= 1"
            )
        self._rng = np.random.default_rng(seed)
        self._heads = [self._draw(template_tokens) for _ in range(templates)]
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.prefix = prefix
        self.count = 0
        self._pending_heads: list[int] = []
        self._pending_tails: list[TokenArray] = []
        self._pending_users: list[int] = []
        self._pending_bids: list[float] = []
        self._users = ["anonymous", *(bidders or {})]
        shares = [float(v) for v in (bidders or {}).values()]
        if any(v < 0 for v in shares) or sum(shares) > 1:
            raise ValueError("bidder shares must be >= 0 and sum to at most 1")
        self._shares = [1.0 - sum(shares), *shares]

    def _draw(self, length: int) -> TokenArray:
        return self._rng.integers(0, VOCAB, size=length, dtype=np.uint32)

    def _refill(self) -> None:
        # One numpy call per 512 requests: per-request draws dominated the simulator's profile.
        tail = self.input_tokens - self._heads[0].shape[0]
        self._pending_heads = self._rng.integers(len(self._heads), size=512).tolist()
        self._pending_tails = list(self._rng.integers(0, VOCAB, size=(512, tail), dtype=np.uint32))
        self._pending_users = self._rng.choice(len(self._users), size=512, p=self._shares).tolist()
        self._pending_bids = pareto_values(self._rng, 512).tolist()

    def __call__(self) -> SimRequest:
        from cluster.sim.cluster import SimRequest

        if not self._pending_heads:
            self._refill()
        head = self._heads[self._pending_heads.pop()]
        user = self._pending_users.pop()
        bid = self._pending_bids.pop()
        self.count += 1
        return SimRequest(
            request_id=f"{self.prefix}-{self.count}",
            tokens=np.concatenate((head, self._pending_tails.pop())),
            output_tokens=self.output_tokens,
            user=self._users[user],
            bid=bid if user else 0.0,
        )
