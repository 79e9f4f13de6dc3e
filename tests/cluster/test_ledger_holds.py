"""Holds on the ledger: reserve at admission, capture the VCG share when answered, release the rest
(cluster/ledger/holds.py). The money invariant under test everywhere: S_i + H_i ≤ B_i."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import auction
import cluster.ledger
from cluster.ledger.book import LedgerBook
from cluster.ledger.schema import SCHEMA_V1, SCHEMA_V2
from cluster.ledger.sqlite import (
    BudgetExceeded,
    Charge,
    ChargeConflictError,
    Hold,
    HoldError,
    Ledger,
    LedgerCorruptError,
    LedgerError,
    UnknownAccountError,
    UnknownHoldError,
    to_micros,
)
from tests.ledger_backends import BACKENDS, Backend, LedgerAt, reap
from tests.ledger_backends import ledger_at as fresh_ledger_at

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ledger(ledger_at: LedgerAt) -> Iterator[LedgerBook]:
    with ledger_at.open() as opened:
        opened.open_account("alice", 10.0)
        opened.open_account("bob", 1.0)
        yield opened


def _invariant(ledger: LedgerBook) -> None:
    every = ledger.available_all()  # what a lease carries, read in one transaction
    for account in ledger.accounts():
        held = ledger.held(account.user)
        assert account.spent + held <= account.budget + 1e-9
        assert ledger.available(account.user) == pytest.approx(
            account.budget - account.spent - held
        )
        assert every[account.user] == ledger.available(account.user)
    assert set(every) == {a.user for a in ledger.accounts()}


def test_every_available_budget_in_one_read(ledger: LedgerBook) -> None:
    ledger.reserve("h1", "alice", 2.5, owner="r1")
    ledger.reserve("h2", "alice", 1.0, owner="r2")
    ledger.reserve("h3", "bob", 0.25, owner="r1")
    ledger.capture("h2", "batch-1", 0.5)
    assert ledger.available_all() == {"alice": 10.0 - 0.5 - 2.5, "bob": 0.75}
    _invariant(ledger)


# -- arithmetic ------------------------------------------------------------------------------------


def test_reserve_capture_release_arithmetic(ledger: LedgerBook) -> None:
    hold = ledger.reserve("r1", "alice", 4.0)
    assert hold == Hold("r1", "alice", 4.0, "open")
    assert (ledger.held("alice"), ledger.available("alice"), ledger.balance("alice")) == (
        4.0,
        6.0,
        10.0,
    )
    charge = ledger.capture("r1", "batch-1", 1.5)
    assert charge == Charge(charge.seq, "batch-1", "alice", 1.5, 8.5, "r1")
    assert ledger.hold("r1") == Hold("r1", "alice", 4.0, "captured", charge.seq)
    # The remainder 4.0 - 1.5 went back with the capture.
    assert (ledger.held("alice"), ledger.available("alice"), ledger.balance("alice")) == (
        0.0,
        8.5,
        8.5,
    )
    ledger.reserve("r2", "alice", 3.0)
    assert ledger.release("r2") == Hold("r2", "alice", 3.0, "released")
    assert ledger.available("alice") == 8.5 and ledger.journal() == [charge]
    assert [h.hold_id for h in ledger.holds("alice")] == ["r1", "r2"]
    assert ledger.holds(state="open") == [] and ledger.holds("bob") == []
    _invariant(ledger)


def test_a_zero_capture_is_a_charge_row_and_closes_the_hold(ledger: LedgerBook) -> None:
    ledger.reserve("r1", "bob", 1.0)
    charge = ledger.capture("r1", "b", 0.0)
    assert charge.amount == 0.0 and ledger.available("bob") == 1.0
    assert ledger.hold("r1").state == "captured"


def test_one_row_per_request_of_a_user_in_one_batch(ledger: LedgerBook) -> None:
    for k in range(3):
        ledger.reserve(f"r{k}", "alice", 2.0)
    rows = [ledger.capture(f"r{k}", "batch-7", 0.5 * (k + 1)) for k in range(3)]
    assert [(c.batch_id, c.hold_id, c.amount) for c in ledger.journal("alice")] == [
        ("batch-7", "r0", 0.5),
        ("batch-7", "r1", 1.0),
        ("batch-7", "r2", 1.5),
    ]
    assert rows == ledger.journal("alice")
    # A plain (simulator) charge under the same (batch, user) is its own key, still once.
    plain = ledger.charge("batch-7", "alice", 1.0)
    assert plain.hold_id == "" and ledger.charge("batch-7", "alice", 1.0) == plain
    assert ledger.balance("alice") == 6.0
    _invariant(ledger)


# -- exactly once ----------------------------------------------------------------------------------


def test_reserve_is_idempotent_and_conflicts_are_refused(ledger: LedgerBook) -> None:
    first = ledger.reserve("r1", "alice", 2.0)
    assert ledger.reserve("r1", "alice", 2.0) == first
    assert ledger.held("alice") == 2.0
    with pytest.raises(ChargeConflictError, match="already reserves"):
        ledger.reserve("r1", "alice", 2.5)
    with pytest.raises(ChargeConflictError):
        ledger.reserve("r1", "bob", 0.5)
    ledger.release("r1")  # a reserve repeated after the close returns the closed hold
    assert ledger.reserve("r1", "alice", 2.0).state == "released"
    assert ledger.held("alice") == 0.0


def test_capture_is_exactly_once(ledger: LedgerBook) -> None:
    ledger.reserve("r1", "alice", 5.0)
    first = ledger.capture("r1", "b1", 2.0)
    assert ledger.capture("r1", "b1", 2.0) == first  # a retry: no second charge
    with pytest.raises(ChargeConflictError, match="already captured"):
        ledger.capture("r1", "b1", 2.5)
    with pytest.raises(ChargeConflictError):
        ledger.capture("r1", "b2", 2.0)
    assert ledger.release("r1").state == "captured"  # release after capture: a no-op
    assert ledger.balance("alice") == 8.0 and len(ledger.journal()) == 1


def test_release_is_idempotent_and_a_released_hold_cannot_be_captured(ledger: LedgerBook) -> None:
    ledger.reserve("r1", "alice", 5.0)
    assert ledger.release("r1") == ledger.release("r1") == Hold("r1", "alice", 5.0, "released")
    with pytest.raises(HoldError, match="released"):
        ledger.capture("r1", "b1", 1.0)
    assert ledger.journal() == [] and ledger.available("alice") == 10.0


# -- refusals --------------------------------------------------------------------------------------


def test_a_bid_above_the_remaining_budget_is_refused_before_it_queues(ledger: LedgerBook) -> None:
    ledger.charge("b0", "alice", 3.0)
    ledger.reserve("r1", "alice", 5.0)
    with pytest.raises(BudgetExceeded) as info:  # the ingress answers 402
        ledger.reserve("r2", "alice", 2.5)
    assert info.value.user == "alice" and info.value.balance == pytest.approx(2.0)
    assert [h.hold_id for h in ledger.holds()] == ["r1"]  # nothing written
    ledger.reserve("r2", "alice", 2.0)  # the exact remainder fits
    assert ledger.available("alice") == 0.0
    with pytest.raises(BudgetExceeded):  # holds count against plain charges too
        ledger.charge("b1", "alice", 0.000001)
    ledger.release("r1")
    ledger.charge("b1", "alice", 5.0)
    _invariant(ledger)


def test_capture_above_the_hold_is_refused(ledger: LedgerBook) -> None:
    ledger.reserve("r1", "alice", 1.0)
    with pytest.raises(HoldError, match="exceeds hold"):
        ledger.capture("r1", "b1", 1.000001)
    assert ledger.hold("r1").state == "open" and ledger.journal() == []
    assert ledger.capture("r1", "b1", 1.0).amount == 1.0  # the whole hold is fine


def test_unknown_holds_users_and_bad_keys(ledger: LedgerBook) -> None:
    with pytest.raises(UnknownAccountError, match="carol"):
        ledger.reserve("r1", "carol", 1.0)
    with pytest.raises(UnknownAccountError):
        ledger.held("carol")
    with pytest.raises(UnknownAccountError):
        ledger.available("carol")
    for call in (
        lambda: ledger.capture("nope", "b1", 0.0),
        lambda: ledger.release("nope"),
        lambda: ledger.hold("nope"),
    ):
        with pytest.raises(UnknownHoldError, match="nope"):
            call()
    assert issubclass(UnknownHoldError, HoldError) and issubclass(HoldError, LedgerError)
    for bad in ("", 1, None):
        with pytest.raises(ValueError, match="hold_id"):
            ledger.reserve(bad, "alice", 1.0)  # type: ignore[arg-type]
    ledger.reserve("r1", "alice", 1.0)
    with pytest.raises(ValueError, match="batch_id"):
        ledger.capture("r1", 3, 1.0)  # type: ignore[arg-type]
    for amount in (-1.0, float("nan"), True):
        with pytest.raises(ValueError, match="amount"):
            ledger.reserve("r2", "alice", amount)
        with pytest.raises(ValueError, match="amount"):
            ledger.capture("r1", "b1", amount)
    with pytest.raises(ValueError, match="state"):
        ledger.holds(state="gone")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="user"):
        ledger.holds("")


def test_holds_without_an_expiry_are_released_at_start(ledger_at: LedgerAt) -> None:
    with ledger_at.open() as ledger:
        ledger.open_account("alice", 10.0)
        for k in range(4):
            ledger.reserve(f"r{k}", "alice", 1.0)
        paid = ledger.capture("r0", "b", 0.5)
        ledger.release("r1")
    with ledger_at.open() as reopened:  # the "crash": r2 and r3 were never answered
        assert reopened.held("alice") == 2.0
        assert reopened.release_abandoned_holds(time.time()) == 2
        assert reopened.release_abandoned_holds(time.time()) == 0
        assert reopened.holds(state="open") == []
        assert reopened.journal() == [paid] and reopened.available("alice") == 9.5


def test_owned_holds_live_while_renewed_and_go_when_they_expire(ledger_at: LedgerAt) -> None:
    with ledger_at.open() as ledger:
        ledger.open_account("alice", 10.0)
        ledger.reserve("live", "alice", 1.0, owner="replica-a", expires=100.0)
        ledger.reserve("dead", "alice", 2.0, owner="replica-b", expires=100.0)
        ledger.reserve("unowned", "alice", 3.0)  # the auction's own: no expiry
        assert ledger.renew_holds("replica-a", 200.0) == 1
        assert ledger.hold("live").expires == 200.0 and ledger.hold("live").owner == "replica-a"
        assert ledger.release_expired_holds(150.0) == 1  # replica-b stopped renewing
        assert ledger.hold("dead").state == "released"
        assert ledger.renew_holds("replica-b", 300.0) == 0  # a released hold does not come back
        ledger.reserve("gone", "alice", 1.0, owner="replica-c", expires=1e12)
        assert ledger.release_holds_of("replica-c") == 1  # its lease ended before the expiry
    with ledger_at.open() as restarted:  # the auction restarts at t = 180: replica-a is alive
        assert restarted.release_abandoned_holds(180.0) == 1  # "unowned" only
        assert restarted.hold("live").state == "open"
        assert restarted.capture("live", "b1", 0.5).amount == 0.5  # its request still pays
        assert restarted.available("alice") == 9.5
    with ledger_at.open() as again, pytest.raises(ValueError, match="expiry"):
        again.reserve("x", "alice", 1.0, expires=float("nan"))


def test_batches_of_reserves_and_settles_are_one_transaction_each(ledger: LedgerBook) -> None:
    out = ledger.reserve_many(
        [("a1", "alice", 4.0), ("b1", "bob", 5.0), ("a2", "alice", 4.0), ("a3", "alice", 4.0),
         ("x", "nobody", 0.0)],
        owner="r", expires=1e9,
    )  # fmt: skip
    assert [type(o).__name__ for o in out] == [
        "Hold", "BudgetExceeded", "Hold", "BudgetExceeded", "UnknownAccountError",
    ]  # fmt: skip
    assert ledger.held("alice") == 8.0 and ledger.held("bob") == 0.0
    assert ledger.reserve_many([("a1", "alice", 4.0)])[0] == out[0]  # a repeat: the same hold
    settled = ledger.settle_many([("a1", "batch-1", 1.5), ("a2", None, 0.0), ("zz", None, 0.0)])
    assert isinstance(settled[0], Charge) and settled[0].amount == 1.5
    assert isinstance(settled[1], Hold) and settled[1].state == "released"
    assert isinstance(settled[2], UnknownHoldError)
    assert ledger.settle_many([("a1", "batch-1", 1.5)]) == [settled[0]]  # exactly once
    assert isinstance(ledger.settle_many([("a1", "batch-2", 1.5)])[0], ChargeConflictError)
    assert ledger.available("alice") == 8.5
    _invariant(ledger)


def test_public_names_stay_importable() -> None:
    # The rules of money are the auction's; the books that keep them raise the same classes.
    for name in ("Hold", "HoldError", "UnknownHoldError", "BudgetExceeded"):
        assert getattr(auction, name) is getattr(sys.modules["cluster.ledger.sqlite"], name)
    assert cluster.ledger.Ledger is sys.modules["cluster.ledger.sqlite"].Ledger


# -- the file --------------------------------------------------------------------------------------


def test_a_schema_1_ledger_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    raw = sqlite3.connect(path)
    try:
        for statement in SCHEMA_V1:
            raw.execute(statement)
        raw.execute("INSERT INTO accounts (user, budget, spent) VALUES ('alice', 5000000, 1500000)")
        raw.execute(
            "INSERT INTO journal (batch_id, user, amount, balance_after) "
            "VALUES ('b1', 'alice', 1000000, 4000000), ('b2', 'alice', 500000, 3500000)"
        )
        raw.commit()
    finally:
        raw.close()
    with Ledger(path) as ledger:
        assert [(c.seq, c.batch_id, c.amount, c.hold_id) for c in ledger.journal()] == [
            (1, "b1", 1.0, ""),
            (2, "b2", 0.5, ""),
        ]
        assert ledger.charge("b1", "alice", 1.0).seq == 1  # still keyed as before
        ledger.reserve("r1", "alice", 3.5)
        assert ledger.capture("r1", "b3", 1.0).seq == 3  # seq continues after the copy
    with Ledger(path) as again:
        assert again.balance("alice") == 2.5
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            again._db.execute("DELETE FROM journal")  # the triggers came back with the table


def test_a_schema_2_ledger_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    raw = sqlite3.connect(path)
    try:
        for statement in SCHEMA_V2:
            raw.execute(statement)
        raw.execute("INSERT INTO accounts (user, budget, spent) VALUES ('alice', 5000000, 1000000)")
        raw.execute(
            "INSERT INTO journal (batch_id, user, hold_id, amount, balance_after) "
            "VALUES ('b1', 'alice', 'h1', 1000000, 4000000)"
        )
        raw.execute(
            "INSERT INTO holds (hold_id, user, amount, state, charge_seq) "
            "VALUES ('h1', 'alice', 2000000, 'captured', 1), ('h2', 'alice', 1000000, 'open', NULL)"
        )
        raw.commit()
    finally:
        raw.close()
    with Ledger(path) as ledger:
        assert [(h.hold_id, h.state, h.owner, h.expires) for h in ledger.holds()] == [
            ("h1", "captured", "", None), ("h2", "open", "", None),
        ]  # fmt: skip
        assert ledger.available("alice") == 3.0
        assert ledger.release_abandoned_holds(time.time()) == 1  # h2 had no owner that renews
    raw = sqlite3.connect(path)
    try:
        with pytest.raises(sqlite3.DatabaseError, match="only closes"):
            raw.execute("UPDATE holds SET state = 'open' WHERE hold_id = 'h2'")  # triggers back
    finally:
        raw.close()


def test_holds_only_close_once_and_tampering_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        ledger.open_account("alice", 5.0)
        ledger.reserve("r1", "alice", 2.0)
        ledger.reserve("r2", "alice", 2.0)
        ledger.capture("r1", "b1", 1.0)
    raw = sqlite3.connect(path)
    try:
        for forged in (
            "UPDATE holds SET state = 'open' WHERE hold_id = 'r1'",  # reopen a closed hold
            "UPDATE holds SET amount = 1 WHERE hold_id = 'r2'",
            "UPDATE holds SET owner = 'thief' WHERE hold_id = 'r2'",
            "UPDATE holds SET expires = 1.0 WHERE hold_id = 'r1'",  # a closed hold never moves
            "DELETE FROM holds",
            "INSERT INTO holds (hold_id, user, amount) VALUES ('r3', 'alice', 2500000)",
            "UPDATE accounts SET spent = 3500000",  # spent + open holds past the budget
        ):
            with pytest.raises(sqlite3.DatabaseError):
                raw.execute(forged)
        # A capture row for a hold that is still open (forged consistently with the balances).
        raw.execute(
            "INSERT INTO journal (batch_id, user, hold_id, amount, balance_after) "
            "VALUES ('b1', 'alice', 'r2', 0, 4000000)"
        )
        raw.commit()
    finally:
        raw.close()
    with pytest.raises(LedgerCorruptError, match="captures a hold that is not captured"):
        Ledger(path)


# -- real processes --------------------------------------------------------------------------------

WORKER = r"""
import os, sys, time
from cluster.ledger.sqlite import BudgetExceeded
from cluster.ledger import open_ledger

location, schema, go, name, count, mode = sys.argv[1:7]
n = int(count)
ledger = open_ledger(location, schema=schema, timeout=60.0)
print("ready", flush=True)
while not os.path.exists(go):  # start together, so the writes interleave
    time.sleep(0.001)
if mode == "batches":  # the ingress's batched exchange: 8 holds, then their settlements
    for b in range(n):
        items = [(f"{name}-{b}-{j}", "alice", 0.25) for j in range(8)]
        ledger.reserve_many(items)
        print(f"reserved {b}", flush=True)
        ledger.settle_many(
            [(h, f"batch-{b}" if j % 2 == 0 else None, 0.125) for j, (h, _, _) in enumerate(items)]
        )
        print(f"settled {b}", flush=True)
    n = 0
for k in range(n):
    hold_id, amount = f"{name}-{k}", (k % 5 + 1) / 4
    try:
        ledger.reserve(hold_id, "alice", amount)
    except BudgetExceeded:
        print(f"refused {k}", flush=True)
        continue
    print(f"reserved {k} {amount}", flush=True)
    if mode == "hold":  # SQLite's busy handler backs off: a pause lets the other writer in
        time.sleep(0.001)
    if mode == "capture":
        charge = ledger.capture(hold_id, f"batch-{k // 4}", amount / 2)
        print(f"captured {k} {charge.seq} {charge.amount}", flush=True)
print("done", flush=True)
"""


def _worker(at: LedgerAt, name: str, n: int, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, *at.args(), str(at.scratch / "go"), name, str(n), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.integration
def test_two_processes_reserving_against_one_budget_never_overspend(ledger_at: LedgerAt) -> None:
    budget = 150.0  # about 200 of the 2 x 300 holds fit; none is released, so they pile up
    with ledger_at.open() as ledger:
        ledger.open_account("alice", budget)
    workers = [_worker(ledger_at, name, 300, "hold") for name in ("p", "q")]
    for w in workers:
        assert w.stdout is not None and w.stdout.readline() == "ready\n"
    (ledger_at.scratch / "go").touch()
    outputs = []
    for w in workers:
        out, _ = w.communicate(timeout=120)
        assert w.returncode == 0, out
        outputs.append(out.splitlines())
    with ledger_at.open() as final:
        held = final.held("alice")
        granted = [line for lines in outputs for line in lines if line.startswith("reserved")]
        assert held == pytest.approx(sum(float(line.split()[2]) for line in granted))
        assert held <= budget and final.available("alice") >= 0
        assert budget - held < 1.25  # used up to less than the largest hold
        refused = [line for lines in outputs for line in lines if line.startswith("refused")]
        assert refused and all(lines[-1] == "done" for lines in outputs)
        assert all(any(line.startswith("reserved") for line in lines) for lines in outputs)
        assert len(final.holds(state="open")) == len(granted)


@pytest.mark.integration
def test_sigkill_mid_stream_leaks_no_hold_and_loses_no_capture(ledger_at: LedgerAt) -> None:
    budget = 1e6
    with ledger_at.open() as ledger:
        ledger.open_account("alice", budget)
    worker = _worker(ledger_at, "w", 5000, "capture")
    (ledger_at.scratch / "go").touch()
    acked: dict[str, tuple[int, float]] = {}
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline() == "ready\n"
        while len(acked) < 30:
            line = worker.stdout.readline()
            assert line.startswith(("reserved", "captured")), line
            if line.startswith("captured"):
                _, k, seq, amount = line.split()
                acked[f"w-{k}"] = (int(seq), float(amount))
        os.kill(worker.pid, signal.SIGKILL)
    finally:
        reap(worker)
    assert worker.returncode == -signal.SIGKILL

    with ledger_at.open() as reopened:  # replays journal and holds
        reopened.release_abandoned_holds(time.time())  # what the service does when it starts
        captures = {c.hold_id: c for c in reopened.journal()}
        for hold_id, (seq, amount) in acked.items():  # every acknowledged capture, once
            assert (captures[hold_id].seq, captures[hold_id].amount) == (seq, amount)
        # At most the one in flight at the kill committed without its acknowledgement.
        assert len(captures) - len(acked) <= 1
        assert reopened.holds(state="open") == [] and reopened.held("alice") == 0.0
        spent = reopened.account("alice").spent
        assert spent == pytest.approx(sum(c.amount for c in captures.values())) and spent <= budget
        for hold in reopened.holds():
            assert hold.state == ("captured" if hold.hold_id in captures else "released")


@pytest.mark.integration
def test_sigkill_mid_batch_leaves_every_batch_whole(ledger_at: LedgerAt) -> None:
    """A batch of reserves, and a batch of settlements, is one transaction: whatever the kill
    interrupts, each batch's holds are all there or none, all settled or none."""
    with ledger_at.open() as ledger:
        ledger.open_account("alice", 1e6)
    worker = _worker(ledger_at, "w", 100_000, "batches")
    (ledger_at.scratch / "go").touch()
    acked: dict[int, str] = {}
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        while len(acked) < 25 or acked[max(acked)] != "reserved":  # kill between the two
            what, b = worker.stdout.readline().split()
            acked[int(b)] = what
        os.kill(worker.pid, signal.SIGKILL)
    finally:
        reap(worker)
    with ledger_at.open() as reopened:  # replays journal and holds
        batches: dict[int, list[Hold]] = {}
        for hold in reopened.holds():
            batches.setdefault(int(hold.hold_id.split("-")[1]), []).append(hold)
        settled = ["captured", "released"] * 4
        for b, holds in batches.items():
            states = [h.state for h in sorted(holds, key=lambda h: int(h.hold_id.split("-")[2]))]
            assert states in (["open"] * 8, settled), (b, states)
            assert acked.get(b) != "settled" or states == settled
        assert set(acked) <= set(batches)  # every acknowledged batch is there, whole
        assert len(batches) - len(acked) <= 1  # at most the one in flight, unacknowledged
        captured = reopened.journal()
        assert len(captured) == 4 * sum(1 for h in batches.values() if h[0].state != "open")
        assert reopened.account("alice").spent == pytest.approx(0.125 * len(captured))


# -- property --------------------------------------------------------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("reserve"),
            st.integers(0, 7),
            st.sampled_from(["alice", "bob"]),
            st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.5]),
        ),
        st.tuples(
            st.just("capture"),
            st.integers(0, 7),
            st.integers(0, 2),
            st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0]),
        ),
        st.tuples(st.just("release"), st.integers(0, 7), st.just(""), st.just(0.0)),
        st.tuples(
            st.just("charge"),
            st.integers(0, 3),
            st.sampled_from(["alice", "bob"]),
            st.sampled_from([0.25, 1.0]),
        ),
        st.tuples(st.just("restart"), st.just(0), st.just(""), st.just(0.0)),
    ),
    max_size=40,
)


@pytest.mark.parametrize("kind", BACKENDS)
@given(ops=_OPS)
@settings(max_examples=60, deadline=None)
def test_any_sequence_keeps_spent_plus_held_within_budget(
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    kind: Backend,
    ops: list[tuple[str, int, object, float]],
) -> None:
    budgets = {"alice": 3.0, "bob": 1.5}
    holds: dict[str, tuple[str, int, str]] = {}  # hold id -> (user, micros, state): the model
    spent = dict.fromkeys(budgets, 0)
    at = fresh_ledger_at(kind, tmp_path_factory.mktemp("holds"), request)
    ledger = at.open()
    try:
        for user, budget in budgets.items():
            ledger.open_account(user, budget)
        for op, k, arg, amount in ops:
            hold_id, micros = f"h{k}", to_micros(amount)
            if op == "reserve":
                user = str(arg)
                open_ = sum(m for u, m, s in holds.values() if u == user and s == "open")
                free = to_micros(budgets[user]) - spent[user] - open_
                try:
                    ledger.reserve(hold_id, user, amount)
                except ChargeConflictError:
                    assert hold_id in holds and holds[hold_id][:2] != (user, micros)
                except BudgetExceeded:
                    assert hold_id not in holds and micros > free
                else:
                    assert hold_id in holds or micros <= free
                    holds.setdefault(hold_id, (user, micros, "open"))
            elif op == "capture":
                batch = f"b{arg}"
                try:
                    ledger.capture(hold_id, batch, amount)
                except UnknownHoldError:
                    assert hold_id not in holds
                except (HoldError, ChargeConflictError):
                    assert holds[hold_id][2] != "open" or micros > holds[hold_id][1]
                else:
                    user, held, state = holds[hold_id]
                    if state == "open":
                        spent[user] += micros
                        holds[hold_id] = (user, held, "captured")
            elif op == "release":
                if hold_id in holds:
                    ledger.release(hold_id)
                    user, held, state = holds[hold_id]
                    holds[hold_id] = (user, held, "released" if state == "open" else state)
            elif op == "charge":
                user = str(arg)
                with contextlib.suppress(BudgetExceeded, ChargeConflictError):
                    ledger.charge(f"c{k}", user, amount)
            else:  # a restart: the service reopens the ledger and releases what was open
                ledger.close()
                ledger = at.open()
                ledger.release_abandoned_holds(time.time())
                holds = {
                    h: (u, m, "released" if s == "open" else s) for h, (u, m, s) in holds.items()
                }
            spent = {u: to_micros(a.spent) for u, a in ledger.replay().items()}
            _invariant(ledger)
            for hold_id, (_, _, state) in holds.items():
                assert ledger.hold(hold_id).state == state
        ledger.close()
        ledger = at.open()  # the journal replays after all of it
        assert {a.user: a.spent for a in ledger.accounts()} == {
            u: s / 1e6 for u, s in spent.items()
        }
    finally:
        ledger.close()
