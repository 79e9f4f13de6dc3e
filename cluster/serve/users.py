"""The users file of ``disaggctl serve --users FILE`` and API-key authentication (docs/design.md
"Serve runtime").

The file is YAML::

    users:
      - name: alice
        key_sha256: 2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b
        budget: 100.0

Keys arrive as ``Authorization: Bearer <key>`` and are stored only as their SHA-256 (hex), so the
file can be read without exposing a key; :func:`hash_key` computes the digest to put in it.
``budget`` is what the auction's ledger lets the user spend (finite, ≥ 0, ≤ ``MAX_AMOUNT``).

Who may call (decided here, tested in tests/cluster/test_users.py and test_ingress_app.py):
- no users file: every request is ``"anonymous"`` and any key it sends is ignored (OpenAI
  clients always send one, often a placeholder);
- a users file: a key that is sent must be known (else 401); a request without a key is
  ``"anonymous"`` when ``allow_anonymous`` (default, for the demo), else 401.
Anonymous requests have no budget, so they may only bid 0 (the ingress answers 401 otherwise).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from cluster.dataplane.admission import ANONYMOUS
from cluster.ledger.sqlite import MAX_AMOUNT
from cluster.models import StrictModel, load_yaml_model, validate_model

__all__ = [
    "ANONYMOUS",
    "MAX_KEY_CHARS",
    "MAX_USERS",
    "UserEntry",
    "Users",
    "UsersFile",
    "hash_key",
]

MAX_USERS = 10_000
MAX_USERS_FILE_BYTES = 1 << 20
MAX_KEY_CHARS = 512  # longer bearer tokens are refused before hashing (bounded work per request)
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")  # names appear in events, ledgers, logs


def hash_key(key: str) -> str:
    """The ``key_sha256`` to store for ``key``: SHA-256 of its UTF-8 bytes, lowercase hex."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class UserEntry(StrictModel):
    """One user: a name, the SHA-256 of their key, and their budget."""

    name: str = Field(min_length=1, max_length=64)
    key_sha256: str = Field(min_length=64, max_length=64)
    budget: float = Field(ge=0.0, le=MAX_AMOUNT)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(f"must match {_NAME.pattern}")
        if v == ANONYMOUS:
            raise ValueError(f"{ANONYMOUS!r} is reserved for requests without a key")
        return v

    @field_validator("key_sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        if not _HEX64.fullmatch(v):
            raise ValueError("must be 64 lowercase hex digits (the SHA-256 of the key)")
        return v


class UsersFile(StrictModel):
    """The whole file: at most MAX_USERS users, names and key hashes unique."""

    users: list[UserEntry] = Field(max_length=MAX_USERS)

    @model_validator(mode="after")
    def _unique(self) -> UsersFile:
        for what in ("name", "key_sha256"):
            seen: set[str] = set()
            for k, u in enumerate(self.users):
                value = getattr(u, what)
                if value in seen:  # a shared key could not tell its two owners apart
                    raise ValueError(f"users[{k}].{what} repeats an earlier user's")
                seen.add(value)
        return self


class Users:
    """Authentication against a users file, or the open door when there is none."""

    def __init__(self, file: UsersFile | None = None, *, allow_anonymous: bool = True) -> None:
        self.file = file
        self.allow_anonymous = allow_anonymous
        entries = file.users if file is not None else ()
        self._by_digest = {u.key_sha256: (u.key_sha256, u.name) for u in entries}

    @classmethod
    def load(cls, path: str | Path | None, *, allow_anonymous: bool = True) -> Users:
        """Read ``path`` (≤ 1 MiB; errors raise ConfigError naming the file and field), or no
        file for ``None``."""
        if path is None:
            return cls(None, allow_anonymous=allow_anonymous)
        file = load_yaml_model(UsersFile, path, max_bytes=MAX_USERS_FILE_BYTES)
        return cls(file, allow_anonymous=allow_anonymous)

    @classmethod
    def from_wire(
        cls, entries: Sequence[Mapping[str, object]] | None, *, allow_anonymous: bool = True
    ) -> Users:
        """From :meth:`to_wire` output (how the users travel to a Serve replica), validated
        again on arrival."""
        if entries is None:
            return cls(None, allow_anonymous=allow_anonymous)
        file = validate_model(UsersFile, {"users": list(entries)}, "users")
        return cls(file, allow_anonymous=allow_anonymous)

    @classmethod
    def from_keys(
        cls, keys: Mapping[str, tuple[str, float]], *, allow_anonymous: bool = True
    ) -> Users:
        """``{name: (key, budget)}`` → Users, hashing each key (the demo user of ``serve``
        without ``--users``; tests). The keys themselves are not kept."""
        rows = [{"name": n, "key_sha256": hash_key(k), "budget": b} for n, (k, b) in keys.items()]
        return cls.from_wire(rows, allow_anonymous=allow_anonymous)

    @property
    def configured(self) -> bool:
        """Whether a users file is in force (then sent keys must be known)."""
        return self.file is not None

    @property
    def entries(self) -> list[UserEntry]:
        """The users (name, key hash, budget); empty without a file."""
        return list(self.file.users) if self.file is not None else []

    def to_wire(self) -> list[dict[str, object]] | None:
        """The users as plain dicts (hashes only, never keys), or None without a file."""
        if self.file is None:
            return None
        return [u.model_dump() for u in self.file.users]

    def ledger_users(self) -> list[dict[str, object]]:
        """``[{"name", "budget"}]`` for the auction actor's ledger (anonymous has budget 0)."""
        return [{"name": u.name, "budget": u.budget} for u in self.entries]

    def authenticate(self, key: str) -> str | None:
        """The name of the user whose key is ``key``, or None.

        The lookup is by the key's SHA-256: its timing depends only on a digest the caller can
        compute anyway, so it leaks nothing about stored keys; ``hmac.compare_digest`` then
        confirms the match in constant time."""
        if not key or len(key) > MAX_KEY_CHARS:
            return None
        try:
            digest = hash_key(key)
        except UnicodeEncodeError:  # a lone surrogate cannot be any stored key
            return None
        stored, name = self._by_digest.get(digest, ("", ""))
        return name if stored and hmac.compare_digest(digest, stored) else None
