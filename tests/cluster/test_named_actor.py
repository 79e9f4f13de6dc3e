"""A control-plane actor handed over by name (cluster/ray/named_actor.py): what the service
gives the controller actor instead of handles, which Ray would keep in the object store (and
log an ERROR about at every start, ray-project/ray#53727)."""

from __future__ import annotations

import copy
import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from cluster.ray.named_actor import NamedActor


def test_it_pickles_as_its_name_and_finds_the_actor_once_on_first_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found: list[tuple[str, str]] = []
    actor = SimpleNamespace(stats=SimpleNamespace(remote=lambda: "stats"))

    def get_actor(name: str, namespace: str) -> Any:
        found.append((name, namespace))
        return actor

    import ray

    monkeypatch.setattr(ray, "get_actor", get_actor)
    named = NamedActor("disagg-router")
    again = pickle.loads(pickle.dumps(named))
    assert copy.copy(named).name == "disagg-router" and repr(again) == "NamedActor('disagg-router')"
    assert found == []  # nothing looked up until used
    assert again.stats.remote() == "stats" and again.stats.remote() == "stats"
    assert found == [("disagg-router", "disaggctl")]
    with pytest.raises(AttributeError):
        again.__getstate_missing__  # noqa: B018  (a dunder is never an actor method)
