"""One ``/metrics`` for a service of many processes (docs/design.md §5, "Serve runtime").

Every process imports ``telemetry.metrics`` and so holds every family of ``REGISTRY``, but each
family is updated in one process only: the TTFT histogram at the ingress, the PoA gauges in the
PoA actor, and so on. If every process exported its whole registry the ingress would show the
same gauge several times (one real value, the rest zeros). So each process exports only the
families it OWNS (:data:`OWNERS`, via :func:`owned_metrics_text`), and the ingress joins its own
text and the actors' texts with :func:`merge_metrics_texts`.

``disagg_events_dropped_total{reason}`` is the exception: every process has a bus that drops
events, so every process exports it and the merge sums the counts.

Names: prometheus_client calls a counter's family ``disagg_requests`` and its sample
``disagg_requests_total``. :data:`OWNERS` holds family names (what ``registry.collect()`` and the
text parser yield); :func:`owned_metrics_text` accepts either spelling.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample

from telemetry.metrics import REGISTRY

__all__ = ["EVERY_PROCESS", "OWNERS", "merge_metrics_texts", "owned_metrics_text", "owner_of"]

log = logging.getLogger(__name__)

EVERY_PROCESS = ("disagg_events_dropped",)

# Component → family names it exports (docs/design.md §5). Each family has one owner, so a
# merged /metrics never shows a gauge twice; exporting skips what a registry lacks.
OWNERS: dict[str, tuple[str, ...]] = {
    # The Dynamo backend's shadow counts are kept by each ingress replica (ShadowView).
    "ingress": (
        "disagg_ttft_seconds",
        "disagg_itl_seconds",
        "disagg_requests",
        "disagg_dynamo_router_agreement",
        "disagg_dynamo_router_cost_gap",
        "disagg_ingress_actor_calls",
        "disagg_ingress_view_requests",
    ),
    "router": ("disagg_routing_cost",),
    "auction": (
        "disagg_auction_queue_depth",
        "disagg_auction_welfare",
        "disagg_auction_realised_welfare",
        "disagg_auction_revenue",
    ),
    "poa": ("disagg_poa_hat", "disagg_poa_routing", "disagg_poa_capacity", "disagg_poa_impossible"),
    "controller": (
        "disagg_regime",
        "disagg_router_temperature",
        "disagg_router_overlap_weight",
        "disagg_policy_balance",
        "disagg_ttft_p99_smoothed_seconds",
        "disagg_pool_workers",
        "disagg_resplits",
        "disagg_resplit_in_progress",
        # Controller.tick counts its capacity advice (controller/controller.py): the controller
        # process is the only one where this counter moves.
        "disagg_capacity_advice",
        "disagg_backlog_drains",  # Controller.drained (controller/drain.py)
        "disagg_oldest_wait_seconds",  # cluster/ray/pending_routes.py
    ),
    "worker": (),  # workers export only EVERY_PROCESS (their KV publishers' drops)
}


def _family(name: str) -> str:
    return name.removesuffix("_total")


def owner_of(name: str) -> str | None:
    """The component that exports family ``name`` (either spelling), or None."""
    family = _family(name)
    for component, names in OWNERS.items():
        if family in names:
            return component
    return None


class _Filtered:
    """A collector view of ``registry`` restricted to some families (for generate_latest)."""

    def __init__(self, registry: CollectorRegistry, families: frozenset[str]) -> None:
        self._registry = registry
        self._families = families

    def collect(self) -> Iterable[Metric]:
        for metric in self._registry.collect():
            if metric.name in self._families or _family(metric.name) in self._families:
                yield metric


def owned_metrics_text(names: Iterable[str], registry: CollectorRegistry = REGISTRY) -> str:
    """Prometheus text of the families in ``names`` plus :data:`EVERY_PROCESS`.

    ``names`` may spell a counter with or without ``_total``; unknown names are skipped (an
    owner may be declared before its metric exists)."""
    families = frozenset(_family(n) for n in names) | frozenset(EVERY_PROCESS)
    return generate_latest(_Filtered(registry, families)).decode()


def _key(sample: Sample) -> tuple[str, tuple[tuple[str, str], ...]]:
    return sample.name, tuple(sorted(sample.labels.items()))


# Families whose samples add up across processes. A histogram's buckets, _count and _sum are all
# counters underneath; a gauge (and anything else) has one owner, so the first value stands.
_SUMMED = frozenset({"counter", "histogram", "summary"})


def merge_metrics_texts(texts: Iterable[str]) -> str:
    """One exposition text from several: one HELP/TYPE per family, counters/histograms/summaries
    summed per (sample name, labels), gauges and the rest first-seen. A text that does not parse
    is skipped whole and logged (one sick actor must not blank the ingress's /metrics)."""
    merged: dict[str, Metric] = {}  # insertion order: families in the order first seen
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Sample]] = {}
    for text in texts:
        try:
            families = list(text_string_to_metric_families(text))
        except Exception as exc:  # the parser raises ValueError and others on bad text
            log.warning("skipping metrics text that does not parse: %s", exc)
            continue
        for family in families:
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            elif into.type != family.type:
                log.warning(
                    "metric %s is %s here but %s elsewhere; keeping the first",
                    family.name,
                    family.type,
                    into.type,
                )
                continue
            seen = values[family.name]
            for sample in family.samples:
                key = _key(sample)
                old = seen.get(key)
                if old is None:
                    seen[key] = sample
                elif into.type in _SUMMED and not sample.name.endswith("_created"):
                    seen[key] = old._replace(value=old.value + sample.value)
                elif sample.name.endswith("_created"):
                    # A creation time of the sum is the earliest of the parts.
                    seen[key] = old._replace(value=min(old.value, sample.value))
    for name, metric in merged.items():
        metric.samples = list(values[name].values())
    return generate_latest(_Static(list(merged.values()))).decode()


class _Static:
    """A collector that yields fixed families (generate_latest only needs ``collect``)."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return iter(self._metrics)
