"""The ledger's backends under one contract test: each test that takes ``ledger_at`` runs once on
SQLite (a file in the test's folder) and once on PostgreSQL (a schema of its own on the
session's real server, ``tests/postgres_server.py``)."""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from cluster.ledger import open_ledger
from cluster.ledger.book import LedgerBook

Backend = Literal["sqlite", "postgres"]
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.integration)]


@dataclass(frozen=True)
class LedgerAt:
    """Where one test's ledger lives; ``open()`` opens it (again), as a restart would."""

    kind: Backend
    location: str  # a file path or a postgresql:// URL
    schema: str
    scratch: Path  # a folder of the test's own (start files for its processes)

    def open(self, *, timeout: float = 30.0) -> LedgerBook:
        return open_ledger(self.location, schema=self.schema, timeout=timeout)

    def args(self) -> list[str]:
        """How a process the test starts finds it: ``open_ledger(argv[1], schema=argv[2])``."""
        return [self.location, self.schema]


def ledger_at(kind: Backend, scratch: Path, request: pytest.FixtureRequest) -> LedgerAt:
    """A fresh ledger location of ``kind``."""
    if kind == "sqlite":
        return LedgerAt(kind, str(scratch / "ledger.db"), "disaggctl", scratch)
    server = request.getfixturevalue("postgres")
    return LedgerAt(kind, server.url, f"t_{uuid.uuid4().hex[:16]}", scratch)


def reap(process: subprocess.Popen[str]) -> None:
    """Kill a test's writer (if it still runs), wait for it and close its pipe."""
    process.kill()
    process.wait()
    if process.stdout is not None:
        process.stdout.close()
