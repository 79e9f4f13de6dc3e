"""The ledger's PostgreSQL schema: the tables, constraints and triggers of SQLite's version 3
(``cluster/ledger/schema.py``) in PostgreSQL's dialect, in a schema (namespace) of their own.

Differences, each for a reason: amounts are ``BIGINT`` (micro-units up to 10¹⁸, as SQLite's
INTEGER holds them); ``"user"`` is quoted (a reserved word here); holds carry a ``seq`` identity
that orders them as they were reserved (SQLite's rowid); a trigger runs a PL/pgSQL function,
whose ``search_path`` is fixed at creation so that it reads this schema's tables whoever calls
it; ``TRUNCATE`` is refused like ``DELETE``. The invariants are the same: S_i ≤ B_i (CHECK),
S_i + H_i ≤ B_i (triggers), an append-only journal, holds that only close, once.
"""

from __future__ import annotations

__all__ = ["COLUMNS", "TABLES"]

TABLES = (
    """CREATE TABLE accounts (
        "user"  TEXT PRIMARY KEY,
        budget  BIGINT NOT NULL CHECK (budget >= 0),
        spent   BIGINT NOT NULL DEFAULT 0 CHECK (spent >= 0 AND spent <= budget)
    )""",
    """CREATE TABLE journal (
        seq            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        batch_id       TEXT NOT NULL,
        "user"         TEXT NOT NULL REFERENCES accounts ("user"),
        amount         BIGINT NOT NULL CHECK (amount >= 0),
        balance_after  BIGINT NOT NULL CHECK (balance_after >= 0),
        hold_id        TEXT NOT NULL DEFAULT '',
        UNIQUE (batch_id, "user", hold_id)
    )""",
    # One capture per hold; plain charges ('') are keyed by UNIQUE (batch_id, user, hold_id).
    "CREATE UNIQUE INDEX journal_capture ON journal (hold_id) WHERE hold_id <> ''",
    """CREATE TABLE holds (
        seq         BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
        hold_id     TEXT PRIMARY KEY CHECK (hold_id <> ''),
        "user"      TEXT NOT NULL REFERENCES accounts ("user"),
        amount      BIGINT NOT NULL CHECK (amount >= 0),
        state       TEXT NOT NULL DEFAULT 'open'
                    CHECK (state IN ('open', 'captured', 'released')),
        charge_seq  BIGINT UNIQUE REFERENCES journal (seq),
        owner       TEXT NOT NULL DEFAULT '',
        expires     DOUBLE PRECISION,
        CHECK ((state = 'captured') = (charge_seq IS NOT NULL))
    )""",
    "CREATE INDEX holds_open ON holds (\"user\") WHERE state = 'open'",
    "CREATE INDEX holds_owner ON holds (owner) WHERE state = 'open'",
    """CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN RAISE EXCEPTION '%', TG_ARGV[0]; END $$""",
    """CREATE TRIGGER journal_append_only BEFORE UPDATE OR DELETE ON journal
       FOR EACH ROW EXECUTE FUNCTION refuse('the journal is append-only')""",
    """CREATE TRIGGER journal_no_truncate BEFORE TRUNCATE ON journal
       FOR EACH STATEMENT EXECUTE FUNCTION refuse('the journal is append-only')""",
    # A hold closes once; while open only its expiry moves (its owner renews it).
    """CREATE TRIGGER holds_close_once BEFORE UPDATE ON holds FOR EACH ROW
       WHEN (OLD.state <> 'open' OR NEW.seq IS DISTINCT FROM OLD.seq
             OR NEW.hold_id IS DISTINCT FROM OLD.hold_id OR NEW."user" IS DISTINCT FROM OLD."user"
             OR NEW.amount IS DISTINCT FROM OLD.amount OR NEW.owner IS DISTINCT FROM OLD.owner)
       EXECUTE FUNCTION refuse('a hold only closes, and only once')""",
    """CREATE TRIGGER holds_no_delete BEFORE DELETE ON holds
       FOR EACH ROW EXECUTE FUNCTION refuse('holds are never deleted')""",
    """CREATE TRIGGER holds_no_truncate BEFORE TRUNCATE ON holds
       FOR EACH STATEMENT EXECUTE FUNCTION refuse('holds are never deleted')""",
    # S_i + H_i <= B_i, backed by the schema as CHECK (spent <= budget) backs S_i.
    """CREATE FUNCTION holds_within_budget() RETURNS trigger LANGUAGE plpgsql
       SET search_path FROM CURRENT AS $$
       BEGIN
         IF NEW.amount + (SELECT spent FROM accounts WHERE "user" = NEW."user")
            + (SELECT COALESCE(SUM(amount), 0) FROM holds
               WHERE "user" = NEW."user" AND state = 'open')
            > (SELECT budget FROM accounts WHERE "user" = NEW."user") THEN
           RAISE EXCEPTION 'hold exceeds the remaining budget';
         END IF;
         RETURN NEW;
       END $$""",
    """CREATE TRIGGER holds_within_budget BEFORE INSERT ON holds
       FOR EACH ROW EXECUTE FUNCTION holds_within_budget()""",
    """CREATE FUNCTION spent_within_holds() RETURNS trigger LANGUAGE plpgsql
       SET search_path FROM CURRENT AS $$
       BEGIN
         IF NEW.spent + (SELECT COALESCE(SUM(amount), 0) FROM holds
                         WHERE "user" = NEW."user" AND state = 'open') > NEW.budget THEN
           RAISE EXCEPTION 'spent plus open holds exceeds the budget';
         END IF;
         RETURN NEW;
       END $$""",
    """CREATE TRIGGER spent_within_holds BEFORE UPDATE OF spent ON accounts
       FOR EACH ROW EXECUTE FUNCTION spent_within_holds()""",
)

# (table, column, type) of every column TABLES creates, as information_schema names them: what
# a schema must hold exactly to be opened as a ledger (anything else is refused, untouched).
COLUMNS = frozenset(
    {
        ("accounts", "user", "text"),
        ("accounts", "budget", "bigint"),
        ("accounts", "spent", "bigint"),
        ("journal", "seq", "bigint"),
        ("journal", "batch_id", "text"),
        ("journal", "user", "text"),
        ("journal", "amount", "bigint"),
        ("journal", "balance_after", "bigint"),
        ("journal", "hold_id", "text"),
        ("holds", "seq", "bigint"),
        ("holds", "hold_id", "text"),
        ("holds", "user", "text"),
        ("holds", "amount", "bigint"),
        ("holds", "state", "text"),
        ("holds", "charge_seq", "bigint"),
        ("holds", "owner", "text"),
        ("holds", "expires", "double precision"),
    }
)
