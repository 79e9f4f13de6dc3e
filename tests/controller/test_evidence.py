"""Routing by measured effect (controller/evidence.py): the policy a regime applies moves from
cache affinity toward the table's row only while the PoA window says the assignment costs,
damped, bounded to the segment between the two rows, and each move is a push."""

from __future__ import annotations

import pytest

from controller.controller import Controller
from controller.detector import Regime, SaturationDetector
from controller.evidence import EvidencePolicy, EvidenceSettings
from controller.policy import PolicyTable
from router import Router
from tests.controller.test_controller import TH
from tests.controller.test_detector import drive


def _saturated(poa_routing: list[float]) -> tuple[Controller, Router, list[tuple[float, float]]]:
    """A controller with the evidence rule driven into saturation, then one tick per reading;
    the router's (τ, ω) after each."""
    router = Router()
    router.add_worker(0)
    control = Controller(SaturationDetector(TH, dwell=2), PolicyTable(), router,
                         evidence=EvidencePolicy(PolicyTable()))  # fmt: skip
    control.start(0.0)
    drive(control.detector, lambda t: 0.1, 10)
    t = 10
    while control.regime != Regime.SATURATED:
        for k in range(40):
            control.observe(t + k / 40, 9.0)
        control.tick(t + 1.0, poa_routing=1.0)
        t += 1
    seen = []
    for reading in poa_routing:
        for k in range(40):
            control.observe(t + k / 40, 9.0)
        control.tick(t + 1.0, poa_routing=reading)
        seen.append((round(router.policy.tau, 6), round(router.policy.omega, 6)))
        t += 1
    return control, router, seen


def test_saturation_without_evidence_keeps_cache_affinity() -> None:
    """A near-optimal assignment (poa_routing ≈ 1): the table would spread load; the evidence
    says routing cannot buy the TTFT back, so affinity stays and nothing more is pushed."""
    control, _, seen = _saturated([1.0, 1.1, 1.05] * 10)
    assert control.regime == Regime.SATURATED
    assert set(seen) == {(0.0, 1.0)}
    assert control.evidence is not None and control.evidence.balance == 0.0
    assert not [c for c in control.changes if c.cause == "evidence"]


def test_sustained_evidence_moves_toward_the_row_in_steps_and_back() -> None:
    costly, calm = [1.6] * 12, [1.0] * 6
    control, router, seen = _saturated(costly + calm)
    # Five ticks of evidence, then a quarter of the way per tick: 0.25, 0.5, 0.75, 1.
    a, b = PolicyTable().below, PolicyTable().saturated
    blend = [(round(0.75 * a.tau + 0.25 * b.tau, 6), round(0.75 * a.omega + 0.25 * b.omega, 6))]
    assert seen[:4] == [(0.0, 1.0)] * 4 and seen[4] == blend[0]
    assert seen[7:12] == [(b.tau, b.omega)] * 5  # the row itself, never past it
    assert seen[-2:] == [(0.0, 1.0)] * 2  # the evidence gone: back to affinity, a step a tick
    pushes = [c for c in control.changes if c.cause == "evidence"]
    assert len(pushes) == 8 and all(c.regime == Regime.SATURATED for c in pushes)
    versions = [c.version for c in control.changes]
    assert versions == sorted(versions) and router.policy.version == versions[-1]


def test_below_saturation_the_balance_is_nil_whatever_the_window_says() -> None:
    rule = EvidencePolicy(PolicyTable())
    for _ in range(20):
        assert rule.update(Regime.BELOW, 5.0) == 0.0
    assert rule.policy(Regime.BELOW) == PolicyTable().below
    for _ in range(4):
        rule.update(Regime.TRANSITION, float("nan"))  # no reading is no evidence
    assert rule.balance == 0.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"threshold": 0.9}, "threshold"), ({"sustain": 0}, "sustain"), ({"step": 0.0}, "step"),
     ({"quantum": 1.5}, "quantum"), ({"threshold": float("inf")}, "threshold")],
)  # fmt: skip
def test_bad_settings_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        EvidenceSettings(**kwargs)  # type: ignore[arg-type]
