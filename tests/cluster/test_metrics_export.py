"""One /metrics from many processes (cluster/ray/metrics_export.py, docs/design.md §5): each
process exports the families it owns, the ingress merges the texts."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from cluster.ray.metrics_export import (
    EVERY_PROCESS,
    OWNERS,
    merge_metrics_texts,
    owned_metrics_text,
    owner_of,
)
from telemetry import metrics


def _registry() -> tuple[CollectorRegistry, dict[str, object]]:
    """A private registry shaped like telemetry.metrics (the real one is process-global)."""
    r = CollectorRegistry(auto_describe=True)
    objs: dict[str, object] = {
        "hat": Gauge("disagg_poa_hat", "PoA", registry=r),
        "regime": Gauge("disagg_regime", "regime", registry=r),
        "requests": Counter("disagg_requests", "requests", ["status"], registry=r),
        "dropped": Counter("disagg_events_dropped", "dropped", ["reason"], registry=r),
        "ttft": Histogram("disagg_ttft_seconds", "ttft", buckets=(0.1, 1.0), registry=r),
    }
    return r, objs


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _families(text: str) -> list[str]:
    return [f.name for f in text_string_to_metric_families(text)]


def test_owners_name_real_metrics_and_no_family_twice() -> None:
    registered = {m.name for m in metrics.REGISTRY.collect()}
    owned = [name for names in OWNERS.values() for name in names]
    assert len(owned) == len(set(owned))
    assert set(owned) <= registered  # every owned family is a metric the code defines
    # Every registered family has exactly one exporter (or is exported everywhere).
    assert registered - set(owned) == set(EVERY_PROCESS)
    assert set(OWNERS) == {"ingress", "router", "auction", "poa", "controller", "worker"}
    assert owner_of("disagg_requests_total") == "ingress" == owner_of("disagg_requests")
    assert owner_of("disagg_poa_impossible_total") == "poa"
    assert owner_of("nope") is None


def test_owned_text_holds_only_owned_families_and_the_drop_counter() -> None:
    r, objs = _registry()
    objs["hat"].set(1.5)  # type: ignore[attr-defined]
    objs["regime"].set(2)  # type: ignore[attr-defined]
    objs["dropped"].labels("gap").inc(3)  # type: ignore[attr-defined]
    text = owned_metrics_text(OWNERS["poa"], registry=r)
    # telemetry.metrics turns prometheus_client's `_created` series off for every registry.
    assert _families(text) == ["disagg_poa_hat", "disagg_events_dropped"]
    values = _samples(text)
    assert values[("disagg_poa_hat", ())] == 1.5
    assert values[("disagg_events_dropped_total", (("reason", "gap"),))] == 3
    # A counter named by its sample name (with _total) is the same family.
    assert "disagg_requests_total" in owned_metrics_text(["disagg_requests_total"], registry=r)
    assert _families(owned_metrics_text([], registry=r)) == ["disagg_events_dropped"]


def test_owned_text_of_the_real_registry_parses() -> None:
    for component, names in OWNERS.items():
        text = owned_metrics_text(names)
        families = set(_families(text))
        assert "disagg_events_dropped" in families, component
        assert families - {n + "_created" for n in names} - set(EVERY_PROCESS) - {
            "disagg_events_dropped_created"
        } <= set(names)


def test_merge_sums_counters_and_histograms_and_keeps_first_gauges() -> None:
    texts = []
    for i in range(3):
        r, objs = _registry()
        objs["hat"].set(1.0 + i)  # type: ignore[attr-defined]
        objs["requests"].labels("ok").inc(2)  # type: ignore[attr-defined]
        objs["requests"].labels(f"only{i}").inc()  # type: ignore[attr-defined]
        objs["dropped"].labels("gap").inc(i)  # type: ignore[attr-defined]
        objs["ttft"].observe(0.05 * (i + 1))  # type: ignore[attr-defined]
        objs["ttft"].observe(5.0)  # type: ignore[attr-defined]
        texts.append(owned_metrics_text([], registry=r) if i else _all(r))
    merged = merge_metrics_texts(texts)
    values = _samples(merged)  # re-parses: the merge is valid exposition text
    assert values[("disagg_poa_hat", ())] == 1.0  # only the first text exported it
    assert values[("disagg_events_dropped_total", (("reason", "gap"),))] == 0 + 1 + 2
    assert values[("disagg_requests_total", (("status", "ok"),))] == 2
    assert values[("disagg_ttft_seconds_count", ())] == 2
    # One HELP and TYPE per family, whatever repeats.
    for line in ("# TYPE disagg_events_dropped_total counter", "# HELP disagg_poa_hat PoA"):
        assert merged.count(line + "\n") == 1

    same = [_all(_filled(k)) for k in (1, 2)]
    merged = _samples(merge_metrics_texts(same))
    assert merged[("disagg_requests_total", (("status", "ok"),))] == 3
    assert merged[("disagg_requests_total", (("status", "solo1"),))] == 1
    assert merged[("disagg_ttft_seconds_bucket", (("le", "0.1"),))] == 1 + 2
    assert merged[("disagg_ttft_seconds_bucket", (("le", "+Inf"),))] == 3
    assert merged[("disagg_ttft_seconds_sum", ())] == pytest.approx(0.05 * 3)
    assert merged[("disagg_regime", ())] == 1  # gauge: the first value seen


def _all(r: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(r).decode()


def _filled(k: int) -> CollectorRegistry:
    r, objs = _registry()
    objs["requests"].labels("ok").inc(k)  # type: ignore[attr-defined]
    objs["requests"].labels(f"solo{k}").inc()  # type: ignore[attr-defined]
    objs["regime"].set(k)  # type: ignore[attr-defined]
    for _ in range(k):
        objs["ttft"].observe(0.05)  # type: ignore[attr-defined]
    return r


def test_merge_skips_a_text_that_does_not_parse_and_handles_nothing() -> None:
    good = _all(_filled(1))
    merged = merge_metrics_texts(["disagg_x{ broken\n", good, ""])
    assert _samples(merged) == _samples(merge_metrics_texts([good]))
    assert merge_metrics_texts([]) == ""


def test_merge_keeps_the_first_type_when_texts_disagree() -> None:
    a = "# TYPE disagg_thing gauge\ndisagg_thing 4\n"
    b = "# TYPE disagg_thing_total counter\ndisagg_thing_total 7\n"
    assert _samples(merge_metrics_texts([a, b])) == {("disagg_thing", ()): 4.0}
