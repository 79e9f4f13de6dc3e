from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.ledger.book import LedgerBook
from cluster.ledger.sqlite import (
    MAX_AMOUNT,
    BudgetExceeded,
    Charge,
    ChargeConflictError,
    Ledger,
    LedgerCorruptError,
    LedgerError,
    UnknownAccountError,
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


# -- unit ------------------------------------------------------------------------------------------


def test_charge_moves_the_balance_and_is_journalled(ledger: LedgerBook) -> None:
    charge = ledger.charge("b1", "alice", 2.5)
    assert charge == Charge(charge.seq, "b1", "alice", 2.5, 7.5)
    ledger.charge("2", "alice", 0.0)  # a VCG price of zero is still a charge (and a key)
    assert ledger.balance("alice") == 7.5
    assert [(c.batch_id, c.amount) for c in ledger.journal("alice")] == [("b1", 2.5), ("2", 0.0)]
    assert ledger.account("alice").spent == 2.5


def test_repeated_charge_is_a_no_op_returning_the_original(ledger: LedgerBook) -> None:
    first = ledger.charge("b1", "alice", 3.0)
    assert ledger.charge("b1", "alice", 3.0) == first
    assert ledger.balance("alice") == 7.0
    assert len(ledger.journal()) == 1
    # Same batch, another user: a different key.
    assert ledger.charge("b1", "bob", 0.5).seq != first.seq


def test_repeated_key_with_another_amount_is_a_conflict(ledger: LedgerBook) -> None:
    ledger.charge("b1", "alice", 3.0)
    with pytest.raises(ChargeConflictError, match="already charged"):
        ledger.charge("b1", "alice", 3.5)
    assert ledger.balance("alice") == 7.0 and len(ledger.journal()) == 1


def test_overdraft_raises_budget_exceeded_and_writes_nothing(ledger: LedgerBook) -> None:
    ledger.charge("b1", "bob", 0.75)
    with pytest.raises(BudgetExceeded, match="exceeds its remaining budget") as info:
        ledger.charge("b2", "bob", 0.3)
    assert info.value.user == "bob" and info.value.balance == pytest.approx(0.25)
    assert isinstance(info.value, LedgerError)
    assert ledger.balance("bob") == 0.25 and len(ledger.journal("bob")) == 1
    ledger.charge("b2", "bob", 0.25)  # the exact remainder fits
    assert ledger.balance("bob") == 0.0
    with pytest.raises(BudgetExceeded):
        ledger.charge("b3", "bob", 0.000001)
    # The refused key stays free: a later, affordable charge under it is not a conflict.
    ledger.charge("b3", "bob", 0.0)


def test_unknown_account_and_bad_input(ledger: LedgerBook) -> None:
    with pytest.raises(UnknownAccountError, match="carol"):
        ledger.charge("b1", "carol", 1.0)
    with pytest.raises(UnknownAccountError):
        ledger.balance("carol")
    for amount in (-1.0, math.nan, math.inf, "3", True):
        with pytest.raises(ValueError):
            ledger.charge("b1", "alice", amount)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_id"):
        ledger.charge("", "alice", 1.0)
    with pytest.raises(ValueError, match="batch_id"):
        ledger.charge(1.5, "alice", 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="user"):
        ledger.charge("b1", "", 1.0)
    with pytest.raises(ValueError, match="budget"):
        ledger.open_account("dave", -5.0)
    assert ledger.journal() == []


def test_accounts_open_once(ledger: LedgerBook) -> None:
    assert ledger.open_account("alice", 10.0).budget == 10.0  # same budget: a no-op
    with pytest.raises(LedgerError, match="already exists"):
        ledger.open_account("alice", 20.0)
    assert [a.user for a in ledger.accounts()] == ["alice", "bob"]


def test_money_is_counted_in_exact_micro_units(ledger: LedgerBook) -> None:
    for k in range(10):
        ledger.charge(f"b{k}", "alice", 0.1)
    assert ledger.balance("alice") == 9.0  # ten float 0.1s would not sum to exactly 1.0
    assert to_micros(0.1) == 100_000 and to_micros(1e-7) == 0


def test_reopen_replays_the_journal(ledger_at: LedgerAt) -> None:
    with ledger_at.open() as ledger:
        ledger.open_account("alice", 5.0)
        charges = [ledger.charge(f"b{k}", "alice", 1.25) for k in range(3)]
    with ledger_at.open() as reopened:
        assert reopened.balance("alice") == 1.25
        assert reopened.journal() == charges
        assert reopened.replay()["alice"].spent == 3.75
        assert reopened.charge("b1", "alice", 1.25) == charges[1]  # still idempotent


def test_a_sqlite_ledger_commits_with_wal_and_full_sync(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        mode = ledger._db.execute("PRAGMA journal_mode").fetchone()[0]
        sync = ledger._db.execute("PRAGMA synchronous").fetchone()[0]
        assert (mode, sync) == ("wal", 2)  # 2 = FULL


def test_journal_is_append_only_and_tampering_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        ledger.open_account("alice", 5.0)
        ledger.charge("b1", "alice", 2.0)
    raw = sqlite3.connect(path)
    try:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("UPDATE journal SET amount = 0")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("DELETE FROM journal")
        with pytest.raises(sqlite3.IntegrityError):  # the schema forbids an overdraft as well
            raw.execute("UPDATE accounts SET spent = 6000000")
        raw.execute("UPDATE accounts SET spent = 0")  # forge the account, not the journal
        raw.commit()
    finally:
        raw.close()
    with pytest.raises(LedgerCorruptError, match="journal sums to"):
        Ledger(path)


@given(
    steps=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=6),  # batch
            st.sampled_from(["alice", "bob"]),
            st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]),
        ),
        max_size=30,
    )
)
@settings(max_examples=40, deadline=None)
@pytest.mark.parametrize("kind", BACKENDS)
def test_ledger_matches_a_model(
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    kind: Backend,
    steps: list[tuple[int, str, float]],
) -> None:
    budgets = {"alice": 3.0, "bob": 1.5}
    charged: dict[tuple[str, str], float] = {}
    with fresh_ledger_at(kind, tmp_path_factory.mktemp("model"), request).open() as ledger:
        for user, budget in budgets.items():
            ledger.open_account(user, budget)
        for batch, user, amount in steps:
            key = (str(batch), user)
            spent = sum(a for (_, u), a in charged.items() if u == user)
            new = key not in charged
            try:
                ledger.charge(str(batch), user, amount)
            except ChargeConflictError:
                assert not new and charged[key] != amount
            except BudgetExceeded:
                assert new and spent + amount > budgets[user]
            else:
                if new:
                    assert spent + amount <= budgets[user]
                    charged[key] = amount
                else:
                    assert charged[key] == amount
        for user, budget in budgets.items():
            spent = sum(a for (_, u), a in charged.items() if u == user)
            assert ledger.balance(user) == pytest.approx(budget - spent)
            assert ledger.balance(user) >= 0
        assert len(ledger.journal()) == len(charged)


# -- files that are not ledgers --------------------------------------------------------------------


def test_a_garbage_file_is_refused_naming_its_path_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    garbage = b"this is not a SQLite database, " * 200
    path.write_bytes(garbage)
    with pytest.raises(LedgerCorruptError, match=f"{path}.*not a readable ledger") as info:
        Ledger(path)
    assert isinstance(info.value, LedgerError)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)  # the reason, kept
    assert path.read_bytes() == garbage


def _other_database(path: Path, schema: str) -> None:
    raw = sqlite3.connect(path)
    try:
        raw.execute(schema)
        raw.execute("INSERT INTO " + schema.split()[2] + " VALUES ('x', 1)")
        raw.commit()
    finally:
        raw.close()


@pytest.mark.parametrize(
    "schema",
    [
        "CREATE TABLE users (name TEXT, age INTEGER)",  # someone else's database
        "CREATE TABLE accounts (name TEXT, money REAL)",  # a table of the same name, not ours
    ],
)
def test_a_sqlite_database_of_another_schema_is_not_a_ledger(tmp_path: Path, schema: str) -> None:
    path = tmp_path / "other.db"
    _other_database(path, schema)
    with pytest.raises(LedgerCorruptError, match=f"{path} is not a ledger"):
        Ledger(path)
    raw = sqlite3.connect(path)
    try:  # nothing was added to it, nor its journal mode changed
        tables = [row[0] for row in raw.execute("SELECT name FROM sqlite_master")]
        assert tables == [schema.split()[2]]
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] != "wal"
    finally:
        raw.close()


def test_a_ledger_file_in_a_missing_directory_is_a_ledger_error(tmp_path: Path) -> None:
    path = tmp_path / "no-such-dir" / "ledger.db"
    with pytest.raises(LedgerError, match=str(path)):
        Ledger(path)


def test_forged_rows_are_corruption_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        ledger.open_account("alice", 5.0)
    raw = sqlite3.connect(path)
    try:  # text passes CHECK (amount >= 0): SQLite orders any text after every number
        raw.execute(
            "INSERT INTO journal (batch_id, user, amount, balance_after) "
            "VALUES ('b1', 'alice', 'lots', 'none')"
        )
        raw.commit()
    finally:
        raw.close()
    with pytest.raises(LedgerCorruptError, match=f"{path}.*journal row 1.*'lots'"):
        Ledger(path)


@pytest.mark.parametrize("timeout", [0.0, -1.0, math.nan, math.inf, True, "30"])
def test_bad_timeouts_are_refused(tmp_path: Path, timeout: object) -> None:
    with pytest.raises(ValueError, match="timeout"):
        Ledger(tmp_path / "ledger.db", timeout=timeout)  # type: ignore[arg-type]


# -- bounds on money and keys ----------------------------------------------------------------------


def test_budgets_and_charges_are_bounded_by_max_amount(ledger: LedgerBook) -> None:
    # 1e13 units are 1e19 micro-units, past SQLite's int64 (2**63 - 1 ≈ 9.2e18).
    for budget in (1e13, MAX_AMOUNT * (1 + 1e-15), 10**400, math.inf, math.nan, -1.0):
        with pytest.raises(ValueError, match="budget"):
            ledger.open_account("whale", budget)  # type: ignore[arg-type]
    whale = ledger.open_account("whale", MAX_AMOUNT)
    assert whale.budget == MAX_AMOUNT and whale.balance == MAX_AMOUNT
    for amount in (1e13, MAX_AMOUNT * 2, 10**400, math.inf):
        with pytest.raises(ValueError, match="amount must be"):
            ledger.charge("b1", "whale", amount)  # type: ignore[arg-type]
    ledger.charge("b1", "whale", MAX_AMOUNT - 0.5)
    ledger.charge("b2", "whale", 0.5)
    assert ledger.balance("whale") == 0.0
    assert ledger.replay()["whale"].spent == MAX_AMOUNT


def test_large_amounts_round_to_the_nearest_micro_unit_exactly() -> None:
    # 135229879868.28882 is 135229879868.288818359375 in binary: 135229879868288818.36 micro-
    # units; the float product amount * 1e6 rounds to ...816, two micro-units off.
    assert to_micros(135229879868.28882) == 135229879868288818
    assert to_micros(MAX_AMOUNT) == 10**18
    assert to_micros(2.5e-6) == 3  # 2.5e-6 is 2.50000000000000010...e-6 in binary


def test_batch_ids_are_strings_only_so_1_and_the_string_1_cannot_collide(
    ledger: LedgerBook,
) -> None:
    for batch_id in (1, 1.0, True, None, b"1"):
        with pytest.raises(ValueError, match="batch_id must be a string"):
            ledger.charge(batch_id, "alice", 1.0)  # type: ignore[arg-type]
    first = ledger.charge("1", "alice", 1.0)
    assert first.batch_id == "1" and ledger.journal() == [first]


# -- integration: real processes -------------------------------------------------------------------

WRITER = r"""
import sys
from cluster.ledger.sqlite import BudgetExceeded
from cluster.ledger import open_ledger

location, schema, user, start, stop = *sys.argv[1:4], int(sys.argv[4]), int(sys.argv[5])
ledger = open_ledger(location, schema=schema, timeout=60.0)
for k in range(start, stop):
    amount = (k % 7 + 1) / 8
    try:
        charge = ledger.charge(f"batch-{k}", user, amount)
    except BudgetExceeded:
        print(f"exceeded {k}", flush=True)
        continue
    # Acknowledged only once ``charge`` has returned, i.e. after the commit.
    print(f"ok {k} {charge.seq} {charge.amount}", flush=True)
print("done", flush=True)
"""


def _writer(at: LedgerAt, user: str, start: int, stop: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, *at.args(), user, str(start), str(stop)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def _amount(k: int) -> float:
    return (k % 7 + 1) / 8


@pytest.mark.integration
def test_sigkill_mid_stream_loses_no_charge_and_duplicates_none(ledger_at: LedgerAt) -> None:
    with ledger_at.open() as ledger:
        ledger.open_account("alice", 1e9)
    stream = 2000  # far more than gets written before the kill
    writer = _writer(ledger_at, "alice", 0, stream)
    acked: dict[int, int] = {}
    try:
        assert writer.stdout is not None
        while len(acked) < 40:
            line = writer.stdout.readline()
            assert line.startswith("ok"), line
            _, k, seq, _ = line.split()
            acked[int(k)] = int(seq)
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        reap(writer)
    assert writer.returncode == -signal.SIGKILL

    with ledger_at.open() as reopened:  # replays and checks the journal
        journal = reopened.journal("alice")
        by_key = {c.batch_id: c for c in journal}
        assert len(by_key) == len(journal)  # no duplicates
        for k, seq in acked.items():
            assert by_key[f"batch-{k}"].seq == seq  # every acknowledged charge, exactly once
        assert max(acked) < stream - 1  # it really was killed mid-stream
        assert sum(c.amount for c in journal) == pytest.approx(reopened.account("alice").spent)

    # The retry replays the whole stream: what was written stays, the rest is added once.
    rerun = _writer(ledger_at, "alice", 0, 200)
    out, _ = rerun.communicate(timeout=120)
    assert rerun.returncode == 0 and out.rstrip().endswith("done")
    with ledger_at.open() as final:
        keys = [c.batch_id for c in final.journal("alice") if int(c.batch_id.split("-")[1]) < 200]
        assert sorted(keys) == sorted(f"batch-{k}" for k in range(200))
        for k, seq in acked.items():
            assert next(c for c in final.journal() if c.batch_id == f"batch-{k}").seq == seq


@pytest.mark.integration
def test_two_processes_charging_concurrently_never_overdraw_or_duplicate(
    ledger_at: LedgerAt,
) -> None:
    budget = 40.0  # about 70 of the 120 charges fit
    with ledger_at.open() as ledger:
        ledger.open_account("alice", budget)
    # Both writers walk the same keys, so every key is contended.
    writers = [_writer(ledger_at, "alice", 0, 120), _writer(ledger_at, "alice", 0, 120)]
    outputs = []
    try:
        for w in writers:
            out, _ = w.communicate(timeout=120)
            assert w.returncode == 0, out
            outputs.append(out.splitlines())
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait()

    with ledger_at.open() as final:
        journal = final.journal("alice")
        assert len({c.batch_id for c in journal}) == len(journal)  # exactly once per key
        spent = sum(c.amount for c in journal)
        assert spent <= budget + 1e-9 and final.balance("alice") >= 0
        assert final.account("alice").spent == pytest.approx(spent)
        by_key = {c.batch_id: c for c in journal}
        for lines in outputs:
            assert lines[-1] == "done"
            for line in lines[:-1]:
                kind, k, *rest = line.split()
                if kind == "ok":  # both processes see the same (single) charge for a key
                    assert by_key[f"batch-{k}"].seq == int(rest[0])
                    assert float(rest[1]) == _amount(int(k))
        refused = {line for lines in outputs for line in lines if line.startswith("exceeded")}
        assert refused  # the budget ran out and said so
        assert spent > budget - 1.0  # and it was used up to less than the largest charge
