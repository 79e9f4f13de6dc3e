"""The ledger's SQLite schema: version 3 (accounts, journal, holds with an owner and an expiry)
and the upgrades from 1 and 2.

Version 1 (before holds) had no ``holds`` table and keyed the journal by (batch_id, user);
version 2 had holds without ``owner`` and ``expires``. Both are recognised so that an old ledger
file is upgraded in place instead of refused. The invariants the
schema backs (``cluster/ledger/sqlite.py``, ``cluster/ledger/holds.py``): S_i ≤ B_i (CHECK), S_i +
H_i ≤ B_i
(triggers), an append-only journal, holds that only close, once.
"""

from __future__ import annotations

import sqlite3
from functools import cache

__all__ = ["SCHEMA", "UPGRADES", "VERSION", "SchemaObjects", "schema", "schema_of"]

VERSION = 3

# A hold's owner is who answers for its request (an ingress replica's lease, or the auction
# instance that admitted it); ``expires`` is the wall-clock second (Unix time) after which an
# open hold counts as abandoned: its owner stopped renewing (cluster/ledger/holds.py). NULL: never.
HOLDS_TABLE = """CREATE TABLE IF NOT EXISTS holds (
        hold_id     TEXT PRIMARY KEY CHECK (hold_id != ''),
        user        TEXT NOT NULL REFERENCES accounts(user),
        amount      INTEGER NOT NULL CHECK (amount >= 0),
        state       TEXT NOT NULL DEFAULT 'open'
                    CHECK (state IN ('open', 'captured', 'released')),
        charge_seq  INTEGER UNIQUE REFERENCES journal(seq),
        owner       TEXT NOT NULL DEFAULT '',
        expires     REAL,
        CHECK ((state = 'captured') = (charge_seq IS NOT NULL))
    )"""
HOLDS_INDEXES = (
    "CREATE INDEX IF NOT EXISTS holds_open ON holds (user) WHERE state = 'open'",
    "CREATE INDEX IF NOT EXISTS holds_owner ON holds (owner) WHERE state = 'open'",
)
# A hold closes once; while open only its expiry moves (its owner renews it); otherwise it never
# changes, and none is ever deleted (the record of what was reserved and why money moved stays).
HOLDS_CLOSE_ONCE = """CREATE TRIGGER IF NOT EXISTS holds_close_once BEFORE UPDATE ON holds
       WHEN OLD.state != 'open' OR NEW.hold_id IS NOT OLD.hold_id OR NEW.user IS NOT OLD.user
            OR NEW.amount IS NOT OLD.amount OR NEW.owner IS NOT OLD.owner
       BEGIN SELECT RAISE(ABORT, 'a hold only closes, and only once'); END"""

HOLDS_NO_DELETE = """CREATE TRIGGER IF NOT EXISTS holds_no_delete BEFORE DELETE ON holds
       BEGIN SELECT RAISE(ABORT, 'holds are never deleted'); END"""
# The invariant S_i + H_i <= B_i, backed by the schema as CHECK(spent <= budget) backs S_i.
HOLDS_BUDGET = (
    """CREATE TRIGGER IF NOT EXISTS holds_within_budget BEFORE INSERT ON holds
       WHEN NEW.amount + (SELECT spent FROM accounts WHERE user = NEW.user)
            + (SELECT COALESCE(SUM(amount), 0) FROM holds WHERE user = NEW.user AND state = 'open')
            > (SELECT budget FROM accounts WHERE user = NEW.user)
       BEGIN SELECT RAISE(ABORT, 'hold exceeds the remaining budget'); END""",
    """CREATE TRIGGER IF NOT EXISTS spent_within_holds BEFORE UPDATE OF spent ON accounts
       WHEN NEW.spent
            + (SELECT COALESCE(SUM(amount), 0) FROM holds WHERE user = NEW.user AND state = 'open')
            > NEW.budget
       BEGIN SELECT RAISE(ABORT, 'spent plus open holds exceeds the budget'); END""",
)
HOLDS_SCHEMA = (HOLDS_TABLE, *HOLDS_INDEXES, HOLDS_CLOSE_ONCE, HOLDS_NO_DELETE, *HOLDS_BUDGET)
# Schema 2's holds (no owner, no expiry; an open hold never changed): recognised, upgraded.
HOLDS_V2_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS holds (
        hold_id     TEXT PRIMARY KEY CHECK (hold_id != ''),
        user        TEXT NOT NULL REFERENCES accounts(user),
        amount      INTEGER NOT NULL CHECK (amount >= 0),
        state       TEXT NOT NULL DEFAULT 'open'
                    CHECK (state IN ('open', 'captured', 'released')),
        charge_seq  INTEGER UNIQUE REFERENCES journal(seq),
        CHECK ((state = 'captured') = (charge_seq IS NOT NULL))
    )""",
    HOLDS_INDEXES[0],
    """CREATE TRIGGER IF NOT EXISTS holds_close_once BEFORE UPDATE ON holds
       WHEN OLD.state != 'open' OR NEW.state = 'open' OR NEW.hold_id IS NOT OLD.hold_id
            OR NEW.user IS NOT OLD.user OR NEW.amount IS NOT OLD.amount
       BEGIN SELECT RAISE(ABORT, 'a hold only closes, and only once'); END""",
    HOLDS_NO_DELETE,
    *HOLDS_BUDGET,
)


ACCOUNTS = """CREATE TABLE IF NOT EXISTS accounts (
        user    TEXT PRIMARY KEY,
        budget  INTEGER NOT NULL CHECK (budget >= 0),
        spent   INTEGER NOT NULL DEFAULT 0 CHECK (spent >= 0 AND spent <= budget)
    )"""
JOURNAL_TRIGGERS = (
    """CREATE TRIGGER IF NOT EXISTS journal_no_update BEFORE UPDATE ON journal
       BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS journal_no_delete BEFORE DELETE ON journal
       BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END""",
)
# Schema 1 (before holds): recognised so that an old ledger is upgraded, not refused.
SCHEMA_V1 = (
    ACCOUNTS,
    """CREATE TABLE IF NOT EXISTS journal (
        seq            INTEGER PRIMARY KEY AUTOINCREMENT,
        batch_id       TEXT NOT NULL,
        user           TEXT NOT NULL REFERENCES accounts(user),
        amount         INTEGER NOT NULL CHECK (amount >= 0),
        balance_after  INTEGER NOT NULL CHECK (balance_after >= 0),
        UNIQUE (batch_id, user)
    )""",
    *JOURNAL_TRIGGERS,
)
JOURNAL = """CREATE TABLE IF NOT EXISTS journal (
        seq            INTEGER PRIMARY KEY AUTOINCREMENT,
        batch_id       TEXT NOT NULL,
        user           TEXT NOT NULL REFERENCES accounts(user),
        amount         INTEGER NOT NULL CHECK (amount >= 0),
        balance_after  INTEGER NOT NULL CHECK (balance_after >= 0),
        hold_id        TEXT NOT NULL DEFAULT '',
        UNIQUE (batch_id, user, hold_id)
    )"""
JOURNAL_V2 = (
    ACCOUNTS,
    JOURNAL,
    # One capture per hold; plain charges ('' ) are keyed by UNIQUE(batch_id, user, hold_id).
    "CREATE UNIQUE INDEX IF NOT EXISTS journal_capture ON journal (hold_id) WHERE hold_id != ''",
    *JOURNAL_TRIGGERS,
)
SCHEMA_V2 = (*JOURNAL_V2, *HOLDS_V2_SCHEMA)
SCHEMA = (*JOURNAL_V2, *HOLDS_SCHEMA)
# Schema 1 → 2: rebuild the journal with the hold_id column (a UNIQUE constraint cannot be
# altered in place), then create whatever of the new schema is missing.
UPGRADE_V1 = (
    "ALTER TABLE journal RENAME TO journal_v1",
    JOURNAL,
    "INSERT INTO journal (seq, batch_id, user, amount, balance_after) "
    "SELECT seq, batch_id, user, amount, balance_after FROM journal_v1 ORDER BY seq",
    "DROP TABLE journal_v1",  # and its triggers, which the rename carried along
    *SCHEMA,
)
# Schema 2 → 3: rebuild holds with owner and expires (a column added by ALTER would leave SQL text
# that differs from a new ledger's). The triggers that read ``holds`` go first: a rename would
# rewrite them to read the old table.
UPGRADE_V2 = (
    "DROP TRIGGER spent_within_holds",
    "DROP TRIGGER holds_within_budget",
    "DROP TRIGGER holds_close_once",
    "DROP TRIGGER holds_no_delete",
    "DROP INDEX holds_open",
    "ALTER TABLE holds RENAME TO holds_v2",
    HOLDS_TABLE,
    "INSERT INTO holds (hold_id, user, amount, state, charge_seq) "
    "SELECT hold_id, user, amount, state, charge_seq FROM holds_v2 ORDER BY rowid",
    "DROP TABLE holds_v2",
    *SCHEMA,
)
# From the version found to the current one, in one transaction (``cluster.ledger.sqlite``).
UPGRADES: dict[int, tuple[str, ...]] = {0: SCHEMA, 1: UPGRADE_V1, 2: UPGRADE_V2}

SchemaObjects = frozenset[tuple[str, str, str, str | None]]


@cache
def schema(version: int) -> SchemaObjects:
    """(type, name, table, sql) of every object schema ``version`` creates, as SQLite records
    them."""
    db = sqlite3.connect(":memory:")
    try:
        for statement in {1: SCHEMA_V1, 2: SCHEMA_V2, VERSION: SCHEMA}[version]:
            db.execute(statement)
        return schema_of(db)
    finally:
        db.close()


def schema_of(db: sqlite3.Connection) -> SchemaObjects:
    """The user objects in a database (SQLite's own, ``sqlite_*``, left out)."""
    rows = db.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return frozenset(
        (str(kind), str(name), str(table), None if sql is None else str(sql))
        for kind, name, table, sql in rows
    )
