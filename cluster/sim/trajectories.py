"""Agent trajectories as a closed loop's request source: docs/design.md §8's chains shape, live.

``trajectories`` agents run side by side. Each trajectory is a shared system prompt of
``system_tokens``, its own task of ``task_tokens``, then one observation of ``step_tokens``
per step; step k's prompt is step k − 1's with the next observation appended, for ``steps``
steps, after which the agent starts a new task. Calls serve the trajectories round robin, so a
trajectory's next step is asked for ``trajectories`` calls after its last one: with more
trajectories than clients, about ``trajectories / C`` request lifetimes later, when its last
step has long been prefilled.

Why this shape for the routing experiments: every worker's prefix cache soon holds the system
prompt, but a step's history is cached only where the trajectory's earlier steps were
prefilled. A router that weighs overlap (ω > 0) sends the step back there and prefills one
observation; one that weighs load alone (ω = 0) lands there by chance (1/W on W workers) and
otherwise prefills the history again. So the cache hit rate, and the prefill work, depend on ω,
as they do for the multi-turn traffic KV-aware routers are built for. The calibration workload
(``TemplateSource``: 5 prompt templates that every worker caches within seconds) hits at the
same rate whatever the router does.

With the defaults, prompts run from 2176 to 3968 tokens (3072 on average, the chains' ~3k); a
trajectory whose every step returns to the worker of its last one finds 0.88 of its tokens
cached (``TrajectoryShape.ideal_hit_rate``), and one whose steps land anywhere at least the
system prompt (1024 of 3072, 0.33).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from cluster.sim.workloads import VOCAB, TokenArray

if TYPE_CHECKING:
    from cluster.sim.request import SimRequest

__all__ = ["TrajectoryShape", "TrajectorySource"]


@dataclass(frozen=True)
class TrajectoryShape:
    """The knobs of the trajectories (module docstring); the defaults are the chains' shape."""

    trajectories: int = 256
    steps: int = 8
    system_tokens: int = 1024
    task_tokens: int = 896
    step_tokens: int = 256
    output_tokens: int = 256

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
                raise ValueError(f"{name} must be an integer in [1, 2^20], got {value!r}")

    def ideal_hit_rate(self) -> float:
        """The share of prompt tokens cached when every step returns to the worker that
        prefilled its trajectory's last one (and the first step finds the system prompt)."""
        base = self.system_tokens + self.task_tokens
        lengths = [base + k * self.step_tokens for k in range(1, self.steps + 1)]
        cached = [self.system_tokens, *lengths[:-1]]
        return sum(cached) / sum(lengths)


class TrajectorySource:
    """The next step of the next trajectory, round robin (module docstring); seeded."""

    def __init__(
        self, shape: TrajectoryShape | None = None, *, seed: int = 0, prefix: str = "step"
    ) -> None:
        self.shape = shape = shape or TrajectoryShape()
        self.prefix = prefix
        self.count = 0
        self._rng = np.random.default_rng(seed)
        self._system = self._draw(shape.system_tokens)
        # Per trajectory: the prompt so far and the steps it has taken on its current task.
        self._prompts = [self._new_task() for _ in range(shape.trajectories)]
        self._taken = [0] * shape.trajectories

    def _draw(self, length: int) -> TokenArray:
        return self._rng.integers(0, VOCAB, size=length, dtype=np.uint32)

    def _new_task(self) -> TokenArray:
        return np.concatenate((self._system, self._draw(self.shape.task_tokens)))

    def __call__(self) -> SimRequest:
        from cluster.sim.request import SimRequest

        j = self.count % len(self._prompts)
        if self._taken[j] == self.shape.steps:
            self._prompts[j], self._taken[j] = self._new_task(), 0
        self._prompts[j] = np.concatenate((self._prompts[j], self._draw(self.shape.step_tokens)))
        self._taken[j] += 1
        self.count += 1
        return SimRequest(
            request_id=f"{self.prefix}-{self.count}",
            tokens=self._prompts[j],
            output_tokens=self.shape.output_tokens,
        )
