"""The SQL connection the ledger's queries run on, whichever database holds the ledger.

The ledger's logic (``cluster/ledger/book.py``, ``cluster/ledger/holds.py``) is written once, in
the SQL
that SQLite and PostgreSQL share: ``?`` placeholders (the PostgreSQL backend translates them),
the ``"user"`` column quoted (a reserved word in PostgreSQL) and ``INSERT … RETURNING``. A
backend supplies a connection of this shape, its transactions and its schema:
``cluster.ledger.sqlite``
(SQLite, the laptop default) and ``cluster.ledger.postgres`` (PostgreSQL, for clusters).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

__all__ = ["Db", "Rows"]


class Rows(Protocol):
    """The result of one statement: its rows, or how many rows it changed. A row is ``Any``
    as both drivers type it (sqlite3's and psycopg's tuples of column values): each query
    reads its own columns by position."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Db(Protocol):
    """A connection inside one of the ledger's transactions."""

    def execute(self, sql: str, parameters: Sequence[object] = ..., /) -> Rows: ...
