"""A PostgreSQL ledger's URL and schema name, checked before anything connects.

A PostgreSQL URL never carries a password: it is printed in messages and logs, so the password
comes from libpq's ``PGPASSWORD`` or ``PGPASSFILE`` instead (docs/design.md "Security model").
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from cluster.models import SecretInputError

__all__ = [
    "MAX_URL_CHARS",
    "POSTGRES_SCHEMES",
    "SCHEMA_PATTERN",
    "check_postgres_url",
    "is_postgres_url",
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
