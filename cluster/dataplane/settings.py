"""How an ingress replica keeps its routing view current (``routing:`` in the serve config) and
how it admits (``admission:``).

- ``report_period_s``: how often each replica publishes its absolute per-worker loads (a
  ``load`` event). At most 0.1 s by default, so that a burst routed by one replica shows in the
  others' views within one period: the staleness the controller's temperature is there to absorb.
- ``report_ttl_s``: how long a report counts after it arrives. It must outlive a few periods (a
  lost message costs nothing), and is what bounds how long a dead replica's load stays in the
  others' views.
- ``view_sync_s``: how often a replica reads the control plane's view (policy and pools) from
  the router actor, off the request path. The controller's ``regime`` events and the ``pools``
  events bring changes at once; the sync is what catches a replica up after a lost event.

Admission (``cluster/dataplane/admission.py``, ``auction_link.py``):

- ``lease_ttl_s``: how long the auction's lease lasts without a renewal (the replica renews every
  third of it): how long a dead replica's slots and holds stay taken.
- ``exchange_period_s``: how often a replica exchanges with the auction while requests it could
  not admit locally wait, start or end. At saturation a request waits seconds in the queue
  (the controller's saturation threshold on TTFT P99 is of that order), so a period of 0.1 s
  adds a small fraction to it while one call carries every request of the period: at R requests
  per second through a replica, about 1 / (0.1 · R) calls per request.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from cluster.models import StrictModel

__all__ = [
    "EXCHANGE_PERIOD_S",
    "HOLD_GRACE_S",
    "LEASE_TTL_S",
    "AdmissionSettings",
    "RoutingSettings",
]

# The admission defaults (module docstring), stated once for the config and the code's defaults.
# A replica renews every third of the lease: a live replica keeps its share through two lost
# renewals, and a dead one's slots return to the auction within three seconds.
LEASE_TTL_S = 3.0
EXCHANGE_PERIOD_S = 0.1
# A hold outlives its owner's lease by this much: the longest stall of the auction or its ledger
# (an auction restart replaying a long journal, a PostgreSQL failover, a partition) that a live
# replica's requests ride out and are still charged. The cost: a dead replica's users wait this
# long for the budget its holds reserved.
HOLD_GRACE_S = 60.0


class RoutingSettings(StrictModel):
    report_period_s: float = Field(default=0.05, gt=0.0, le=10.0)
    report_ttl_s: float = Field(default=1.0, gt=0.0, le=60.0)
    view_sync_s: float = Field(default=0.5, gt=0.0, le=60.0)

    @model_validator(mode="after")
    def _ttl_outlives_periods(self) -> RoutingSettings:
        if self.report_ttl_s < 2 * self.report_period_s:
            raise ValueError(
                f"report_ttl_s ({self.report_ttl_s}) must be at least twice report_period_s "
                f"({self.report_period_s}): one lost report must not drop a live replica's load"
            )
        return self


class AdmissionSettings(StrictModel):
    lease_ttl_s: float = Field(default=LEASE_TTL_S, gt=0.0, le=600.0)
    exchange_period_s: float = Field(default=EXCHANGE_PERIOD_S, gt=0.0, le=5.0)
    hold_grace_s: float = Field(default=HOLD_GRACE_S, ge=0.0, le=3600.0)
