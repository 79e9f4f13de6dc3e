from __future__ import annotations

import pytest

from controller.controller import Controller, LeadingIndicator
from controller.detector import Regime, SaturationDetector, Thresholds
from controller.policy import PolicyTable, RegimePolicy
from router import Router
from tests.controller.test_detector import drive

TH = Thresholds(0.5, 2.0)


def test_default_table_is_designs() -> None:
    table = PolicyTable()
    assert table[Regime.BELOW] == RegimePolicy(0.0, 1.0)
    assert table[Regime.TRANSITION] == RegimePolicy(0.7, 1.0)
    assert table[Regime.SATURATED] == RegimePolicy(0.8, 0.1)


def test_policy_yaml_is_validated(tmp_path) -> None:
    good = tmp_path / "p.yaml"
    good.write_text(
        "below: {tau: 0, omega: 1}\ntransition: {tau: 0.5, omega: 1}\n"
        "saturated: {tau: 1.0, omega: 0.2}\n"
    )
    assert PolicyTable.load(good).saturated == RegimePolicy(1.0, 0.2)
    cases = {
        "below: {tau: 0, omega: 1}\n": "missing",
        "below: {tau: -1, omega: 1}\ntransition: {tau: 0, omega: 1}\n"
        "saturated: {tau: 0, omega: 1}\n": "tau must be finite and >= 0",
        "below: {tau: 0, omega: x}\ntransition: {tau: 0, omega: 1}\n"
        "saturated: {tau: 0, omega: 1}\n": "omega must be a number",
        "below: {tau: 0}\ntransition: {tau: 0, omega: 1}\n"
        "saturated: {tau: 0, omega: 1}\n": r"below: expected \{tau, omega\}",
        "below: [": "not YAML",
    }
    for text, message in cases.items():
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            PolicyTable.load(bad)


def test_controller_moves_the_router_with_increasing_versions() -> None:
    router = Router()
    router.add_worker(0)
    changes = []
    control = Controller(
        SaturationDetector(TH, dwell=2), PolicyTable(), router, on_change=changes.append
    )
    control.start(0.0)
    assert router.policy.version == 1 and router.policy.tau == 0.0
    drive(control.detector, lambda t: 0.1, 10)
    for t in range(10, 40):
        for k in range(40):
            control.observe(t + k / 40, 9.0)
        control.tick(t + 1.0)
    assert control.regime == Regime.SATURATED
    assert (router.policy.tau, router.policy.omega) == (0.8, 0.1)
    assert [c.version for c in changes] == sorted({c.version for c in changes})
    assert changes[-1].regime == Regime.SATURATED and router.policy.version == changes[-1].version
    decision = router.decide("r1", list(range(32)))
    assert decision.policy_version == control.version
    # The controller goes away: the router keeps routing with the last policy.
    del control
    assert router.decide("r2", list(range(32))).policy == decision.policy


def test_leading_indicator_switches_early_and_holds() -> None:
    def run(leading):
        router = Router()
        router.add_worker(0)
        control = Controller(
            SaturationDetector(TH, dwell=3), PolicyTable(), router, leading=leading, hold_ticks=4
        )
        control.start(0.0)
        switched = None
        for t in range(60):
            queue = 0 if t < 20 else 25 * (t - 20)  # the queue starts growing at t = 20
            level = 0.1 if t < 30 else 3.0  # TTFT follows ten seconds later
            for k in range(40):
                control.observe(t + k / 40, level)
            control.tick(t + 1.0, queue_depth=queue)
            if switched is None and control.regime > Regime.BELOW:
                switched = t + 1
        return switched, control

    late, _ = run(None)
    early, control = run(LeadingIndicator(queue_rise_per_s=10.0, horizon=3))
    assert early < late
    assert control.changes[1].cause == "leading"
    assert LeadingIndicator().update(0.0, 5, 5) is False  # off by default


def test_capacity_advice_when_saturation_is_not_a_routing_problem() -> None:
    router = Router()
    router.add_worker(0)
    advised = []
    control = Controller(
        SaturationDetector(TH, dwell=1),
        PolicyTable(),
        router,
        advisor=lambda: "2 more prefill GPUs",
        on_advice=advised.append,
        dominance=2.0,
        sustain=5,
    )
    control.start(0.0)
    for t in range(30):
        for k in range(40):
            control.observe(t + k / 40, 9.0)
        control.tick(t + 1.0, poa_routing=1.1, poa_capacity=12.0)
    assert len(advised) == 1 and advised[0].recommendation == "2 more prefill GPUs"
    # Routing-bound saturation gets no capacity advice.
    control2 = Controller(
        SaturationDetector(TH, dwell=1),
        PolicyTable(),
        router,
        advisor=lambda: "x",
        on_advice=advised.append,
        sustain=5,
    )
    for t in range(30):
        for k in range(40):
            control2.observe(t + k / 40, 9.0)
        control2.tick(t + 1.0, poa_routing=4.0, poa_capacity=1.5)
    assert len(advised) == 1


def _controller(**kwargs: object) -> Controller:
    detector = SaturationDetector(Thresholds(0.5, 2.0))
    return Controller(detector, PolicyTable(), Router(16), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"dominance": float("nan")}, "dominance"),
        ({"dominance": 0.5}, "dominance"),
        ({"sustain": 0}, "sustain"),
        ({"hold_ticks": -1}, "hold_ticks"),
        ({"hold_ticks": True}, "hold_ticks"),
    ],
)
def test_bad_controller_settings_name_the_parameter(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        _controller(**kwargs)


@pytest.mark.parametrize("field", ["queue_rise_per_s", "poa_rise_per_s"])
def test_a_nan_leading_rate_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        LeadingIndicator(**{field: float("nan")})  # type: ignore[arg-type]


@pytest.mark.parametrize("signal", ["queue_depth", "poa_hat", "poa_routing", "poa_capacity"])
def test_a_nan_signal_is_refused_not_silently_ignored(signal: str) -> None:
    controller = _controller()
    controller.start(0.0)
    with pytest.raises(ValueError, match=signal):
        controller.tick(1.0, **{signal: float("nan")})  # type: ignore[arg-type]
    controller.tick(2.0, poa_capacity=float("inf"), poa_routing=1.0)  # inf is a reading


def test_a_policy_table_refuses_an_omega_the_router_would_refuse() -> None:
    from router.cost import MAX_OMEGA

    with pytest.raises(ValueError, match="omega"):
        RegimePolicy(0.0, MAX_OMEGA * 2)
