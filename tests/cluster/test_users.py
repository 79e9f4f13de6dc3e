"""The users file and API-key authentication (cluster/serve/users.py; docs/design.md
"Serve runtime")."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.ledger.sqlite import MAX_AMOUNT
from cluster.models import ConfigError
from cluster.serve.users import (
    ANONYMOUS,
    MAX_KEY_CHARS,
    MAX_USERS,
    Users,
    UsersFile,
    hash_key,
)


def entry(name: str, key: str, budget: Any = 10.0) -> dict[str, Any]:
    return {"name": name, "key_sha256": hash_key(key), "budget": budget}


def write(path: Path, users: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"users": users}), encoding="utf-8")
    return path


def test_hash_key_is_sha256_hex_of_the_utf8_key() -> None:
    assert hash_key("sk-é") == hashlib.sha256("sk-é".encode()).hexdigest()


def test_a_file_loads_and_authenticates_by_key(tmp_path: Path) -> None:
    users = Users.load(write(tmp_path / "u.yaml", [entry("alice", "ka"), entry("bob", "kb", 0)]))
    assert users.configured and users.allow_anonymous
    assert users.authenticate("ka") == "alice" and users.authenticate("kb") == "bob"
    for bad in ("kc", "", "ka ", "x" * (MAX_KEY_CHARS + 1), "\ud800"):
        assert users.authenticate(bad) is None
    assert users.ledger_users() == [{"name": "alice", "budget": 10.0},
                                    {"name": "bob", "budget": 0.0}]
    assert [(u.name, u.budget) for u in users.entries] == [("alice", 10.0), ("bob", 0.0)]
    # What travels to a Serve replica: hashes only, and it rebuilds the same Users.
    wire = users.to_wire()
    assert wire is not None and "ka" not in str(wire)
    again = Users.from_wire(wire, allow_anonymous=False)
    assert again.authenticate("kb") == "bob" and not again.allow_anonymous


def test_users_from_clear_keys_keep_only_hashes() -> None:
    users = Users.from_keys({"demo": ("sk-demo", 100.0)})
    assert users.authenticate("sk-demo") == "demo" and users.ledger_users() == [
        {"name": "demo", "budget": 100.0}]
    assert "sk-demo" not in str(users.to_wire())
    with pytest.raises(ConfigError, match="budget"):
        Users.from_keys({"demo": ("k", -1.0)})


def test_no_file_means_no_users() -> None:
    for users in (Users(), Users.load(None), Users.from_wire(None)):
        assert not users.configured and users.to_wire() is None and users.entries == []
        assert users.ledger_users() == [] and users.authenticate("anything") is None


@pytest.mark.parametrize(("users", "field"), [
    ([{**entry("a", "k"), "key_sha256": "A" * 64}], "users[0].key_sha256"),
    ([{**entry("a", "k"), "key_sha256": "a" * 63}], "users[0].key_sha256"),
    ([entry("a", "k", -1.0)], "users[0].budget"),
    ([entry("a", "k", MAX_AMOUNT * 2)], "users[0].budget"),
    ([entry("a", "k", "10")], "users[0].budget"),
    ([entry("a", "k", True)], "users[0].budget"),
    ([entry(ANONYMOUS, "k")], "users[0].name"),
    ([entry("no spaces", "k")], "users[0].name"),
    ([{**entry("a", "k"), "key": "k"}], "users[0].key"),
    ([entry("a", "k1"), entry("a", "k2")], "name repeats"),
    ([entry("a", "k"), entry("b", "k")], "key_sha256 repeats"),
])
def test_bad_files_are_refused_naming_file_and_field(tmp_path: Path, users: list[Any],
                                                     field: str) -> None:
    path = write(tmp_path / "u.yaml", users)
    with pytest.raises(ConfigError) as e:
        Users.load(path)
    assert str(path) in str(e.value) and field in str(e.value)


def test_infinite_budgets_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "u.yaml"
    path.write_text(f"users:\n  - name: a\n    key_sha256: {hash_key('k')}\n    budget: .inf\n")
    with pytest.raises(ConfigError, match="budget"):
        Users.load(path)


def test_size_limits(tmp_path: Path) -> None:
    many = [entry(f"u{i}", f"k{i}") for i in range(MAX_USERS + 1)]
    assert len(UsersFile.model_validate({"users": many[:-1]}).users) == MAX_USERS
    with pytest.raises(ConfigError, match="at most 10000"):
        Users.from_wire(many)
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (1 << 20) + "\nusers: []\n")
    with pytest.raises(ConfigError, match="bytes"):
        Users.load(big)
    with pytest.raises(ConfigError, match="cannot read"):
        Users.load(tmp_path / "missing.yaml")
