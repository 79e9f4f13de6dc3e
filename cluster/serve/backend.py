"""What a request's lifecycle (``cluster/serve/path.py``) asks of the engines behind it: the
``Backend`` protocol, which the simulated engines (``cluster/backends/sim/backend.py``) and Dynamo
(``cluster/backends/dynamo/backend.py``) implement (docs/design.md "Data flow (serve mode)").

The lifecycle owns everything that is the same whatever runs the model: admission and money, the
one retry before the first token, the events, the books that always close. A backend owns where
a request runs and how its tokens come:

- ``place``: choose the workers (and reserve their load in whatever view does the choosing),
  skipping the ones ``excluded`` after a failure; ``WorkerFailed`` or ``ValueError`` when no
  worker can take it;
- ``stream``: run the request there, prefill and KV transfer included, and yield its token
  chunks; ``WorkerFailed`` when a worker fails (before the first chunk the lifecycle retries
  once elsewhere; after it the stream ends with an error);
- ``release``: drop the request's reservations (idempotent; on every exit);
- ``own_metrics_text``: what the replica counts itself (routing cost, agreement), for
  ``/metrics``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from cluster.serve.path_types import PathRequest, TokenChunk

__all__ = ["Backend", "Placement", "WorkerFailed"]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request runs, by slot (``decode_worker`` None: an engine instance no slot holds
    yet, just restarted; the request runs, its events wait for the binding), and what routing
    knew: the prompt's cached prefix, the policy and regime it was placed under."""

    decode_worker: int | None
    prefill_worker: int | None
    prompt_tokens: int
    cached_tokens: int
    policy_version: int
    regime: str


class WorkerFailed(Exception):  # noqa: N818  (a state, not a bug: "the worker failed")
    """A worker could not serve this request; ``worker`` (the backend's own id for it) is
    excluded when the request is placed again."""

    def __init__(self, role: str, worker: int | None, why: str, *, where: str = "") -> None:
        super().__init__(f"{where or f'{role} worker {worker}'}: {why}")
        self.role, self.worker = role, worker


Excluded = Mapping[str, Sequence[int]]  # role → workers that failed this request


class Backend(Protocol):
    async def start(self) -> None: ...

    async def place(self, req: PathRequest, excluded: Excluded) -> Placement: ...

    def stream(self, req: PathRequest, placement: Placement) -> AsyncIterator[TokenChunk]: ...

    async def release(self, request_id: str) -> None: ...

    def own_metrics_text(self) -> str: ...

    async def aclose(self) -> None: ...
