"""The ledger's books for the service: SQLite on a laptop, PostgreSQL on a cluster.

The rules of money (units, records, refusals) are ``auction/money.py``; here they are kept:
``book.py`` (accounts, charges, the journal's replay) and ``holds.py`` (reserve, capture,
release) written once over ``sql.py``'s connection, ``sqlite.py`` and ``postgres.py`` the two
backends, ``schema.py`` and ``postgres_schema.py`` their tables, ``location.py`` the choice."""

from cluster.ledger.location import open_ledger
from cluster.ledger.sqlite import Ledger
from cluster.ledger.urls import check_postgres_url, is_postgres_url

__all__ = ["Ledger", "check_postgres_url", "is_postgres_url", "open_ledger"]
