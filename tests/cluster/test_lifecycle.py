"""One request's lifecycle (cluster/lifecycle.py): the steps in order, one retry, the price due
from the first token, and the events both the service and the simulator publish from it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.lifecycle import MAX_PLACEMENTS, Lifecycle, LifecycleError
from cluster.sim.cluster import SimCluster, SimRequest
from cluster.sim.profile import load_profile
from cluster.sim.records import RequestRecord


def _life(arrival: float = 10.0, output_tokens: int = 5) -> Lifecycle:
    return Lifecycle("r1", "alice", arrival, prompt_tokens=64, output_tokens=output_tokens, bid=2.0)


def test_a_request_goes_through_every_stage_in_order() -> None:
    life = _life()
    assert life.stage == "queued" and life.due == 0.0
    life.release(10.5, payment=0.75, batch_id="b-3")
    assert life.stage == "released" and life.queue_wait == 0.5
    life.place(10.6, decode_worker=4, prefill_worker=0, cached_tokens=32)
    assert life.stage == "placed" and life.due == 0.0  # the position is not delivered yet
    life.start(11.0)
    assert life.stage == "decoding" and life.due == 0.75 and life.ttft == 1.0
    life.finish(12.0)
    assert (life.stage, life.status, life.e2e) == ("done", "ok", 2.0)
    life.close("abandoned")  # after the last token, a client leaving changes nothing
    assert life.status == "ok" and life.due == 0.75


@pytest.mark.parametrize(
    ("steps", "step", "stage"),
    [
        ((), "place", "queued"),
        ((), "start", "queued"),
        (("release",), "start", "released"),
        (("release",), "finish", "released"),
        (("release", "place"), "release", "placed"),
        (("release", "place", "start"), "worker_failed", "decoding"),
        (("release", "place", "start"), "place", "decoding"),
    ],
)
def test_a_step_out_of_order_is_refused_with_where_it_stood(
    steps: tuple[str, ...], step: str, stage: str
) -> None:
    life = _life()
    calls = {
        "release": lambda: life.release(10.0),
        "place": lambda: life.place(10.0, 1),
        "start": lambda: life.start(10.0),
        "finish": lambda: life.finish(10.0),
        "worker_failed": lambda: life.worker_failed("decode", 1),
    }
    for done in steps:
        calls[done]()
    with pytest.raises(LifecycleError, match=f"'r1': {step} while {stage}"):
        calls[step]()


def test_one_retry_before_the_first_token_then_it_has_failed() -> None:
    life = _life()
    life.release(10.0, payment=0.5)
    life.place(10.0, decode_worker=1, prefill_worker=0)
    assert life.worker_failed("decode", 1) is True
    assert life.excluded == {"prefill": [], "decode": [1]}
    life.place(10.1, decode_worker=2, prefill_worker=0)
    assert life.worker_failed("prefill", 0) is False  # the retry failed too: 503
    assert life.excluded == {"prefill": [0], "decode": [1]} and life.placements == MAX_PLACEMENTS
    assert (life.stage, life.due) == ("failed", 0.0)  # never delivered, nothing due
    with pytest.raises(LifecycleError):
        life.place(10.2, decode_worker=3)


def test_a_request_cut_after_its_first_token_still_owes_its_price() -> None:
    life = _life()
    life.release(10.0, payment=0.5)
    life.place(10.0, 1)
    life.start(10.2)
    life.close("failed")  # the worker died mid-stream
    assert (life.stage, life.due) == ("failed", 0.5)


times = st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False)
gaps = st.floats(0.0, 1e3, allow_nan=False, allow_infinity=False)


@given(arrival=times, waits=st.tuples(gaps, gaps, gaps, gaps), outputs=st.integers(1, 4096))
def test_the_events_carry_the_lifecycles_times(
    arrival: float, waits: tuple[float, float, float, float], outputs: int
) -> None:
    life = _life(arrival, outputs)
    t = arrival
    life.release(t := t + waits[0])
    life.place(t := t + waits[1], 3, None, 16)
    life.start(t_first := t + waits[2])
    life.finish(t_done := t_first + waits[3])
    first, done = life.first_token_event(), life.complete_event()
    assert (first.t, first.worker_id, first.prefill_worker_id) == (t_first, 3, None)
    assert first.ttft_s == pytest.approx(t_first - arrival)
    assert done.t == t_done and done.e2e_s == pytest.approx(t_done - arrival)
    assert done.itl_s == pytest.approx((done.e2e_s - done.ttft_s) / max(1, outputs - 1))
    assert (done.cached_tokens, done.output_tokens, done.status) == (16, outputs, "ok")
    assert life.complete_event(itl_s=0.25).itl_s == 0.25  # a measured mean wins


def test_no_event_before_its_time_or_without_a_decode_slot() -> None:
    life = _life()
    with pytest.raises(LifecycleError, match="without a first token"):
        life.first_token_event()
    life.release(10.0)
    life.place(10.0, decode_worker=None)  # an engine no slot holds yet
    life.start(10.1)
    with pytest.raises(LifecycleError, match="no decode slot"):
        life.first_token_event()


def test_the_simulator_and_the_service_step_the_same_lifecycle() -> None:
    # The simulator's records are lifecycles: its requests are released, placed, started and
    # finished by the steps the service's path takes, and refused out of order alike.
    cluster = SimCluster(load_profile("b200-llama70b-fp8-tp4"), "1P/2D", seed=0)
    record = cluster.submit(SimRequest("s1", np.arange(256, dtype=np.uint32), output_tokens=4))
    cluster.loop.run()
    assert isinstance(record, RequestRecord) and isinstance(record, Lifecycle)
    assert record.stage == "done" and record.placements == 1
    assert record.first_token_event().ttft_s == pytest.approx(record.ttft)
    with pytest.raises(LifecycleError, match="finish while done"):
        record.finish(cluster.now)
