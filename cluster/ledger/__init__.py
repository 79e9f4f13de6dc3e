"""The ledger's backends for the service: SQLite on a laptop, PostgreSQL on a cluster."""

from cluster.ledger.location import check_postgres_url, is_postgres_url, open_ledger

__all__ = ["check_postgres_url", "is_postgres_url", "open_ledger"]
