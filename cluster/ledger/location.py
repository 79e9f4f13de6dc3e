"""Where the ledger lives: a SQLite file (the laptop default) or a PostgreSQL URL (clusters).

``open_ledger`` picks the backend from the location. A PostgreSQL URL never carries a password:
it is printed in messages and logs, so the password comes from libpq's ``PGPASSWORD`` or
``PGPASSFILE`` instead (docs/design.md "Security model").
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from auction.ledger import Ledger
from auction.ledger_book import LedgerBook
from auction.money import LedgerError
from cluster.models import SecretInputError

__all__ = [
    "MAX_URL_CHARS",
    "POSTGRES_SCHEMES",
    "SCHEMA_PATTERN",
    "check_postgres_url",
    "is_postgres_url",
    "open_ledger",
]

POSTGRES_SCHEMES = ("postgresql", "postgres")
MAX_URL_CHARS = 2048
SCHEMA_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"  # an unquoted PostgreSQL identifier


def is_postgres_url(location: str) -> bool:
    return urlsplit(location).scheme in POSTGRES_SCHEMES


def check_postgres_url(url: str) -> str:
    """``url`` if it is a PostgreSQL URL without a password, else ``ValueError`` saying why."""
    if not isinstance(url, str) or not 0 < len(url) <= MAX_URL_CHARS:
        raise ValueError(f"a PostgreSQL URL is a string of 1 to {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        password = parts.password
    except ValueError as exc:  # e.g. a port that is not a number
        raise ValueError(f"not a PostgreSQL URL: {exc}") from None
    if parts.scheme not in POSTGRES_SCHEMES:
        raise ValueError(f"a PostgreSQL URL starts with postgresql://, got {parts.scheme!r}://")
    if password is not None or "password" in query:
        raise SecretInputError(
            "the PostgreSQL URL holds a password, which would be logged: "
            "give it in PGPASSWORD or PGPASSFILE instead"
        )
    return url


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
