"""Where the ledger lives: a SQLite file (the laptop default) or a PostgreSQL URL (clusters).
``open_ledger`` picks the backend from the location (the URL's checks: ``urls.py``)."""

from __future__ import annotations

from pathlib import Path

from auction.money import LedgerError
from cluster.ledger.book import LedgerBook
from cluster.ledger.sqlite import Ledger
from cluster.ledger.urls import is_postgres_url

__all__ = ["open_ledger"]

def open_ledger(location: str, *, schema: str = "disaggctl", timeout: float = 30.0) -> LedgerBook:
    """The ledger at ``location``: ``PostgresLedger`` for a ``postgresql://`` URL (in
    ``schema``), else the SQLite ``Ledger`` in that file, its directory created if missing."""
    if is_postgres_url(location):
        from cluster.ledger.postgres import PostgresLedger  # psycopg only where it is used

        return PostgresLedger(location, schema=schema, timeout=timeout)
    parent = Path(location).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LedgerError(f"cannot create the ledger's directory {parent}: {exc}") from None
    return Ledger(location, timeout=timeout)
