"""Who owns the ledger in PostgreSQL, and what its client may do (docs/design.md "Security model").

The ledger's client (the auction actor) logs in as a role that is not a superuser, creates
nothing, and owns nothing: the schema, its tables and its triggers belong to a role that cannot
log in. So the client can read and write rows, and every CHECK and trigger still binds it; it
cannot ``ALTER TABLE … DISABLE TRIGGER`` (an owner's right), ``SET session_replication_role =
replica`` (a superuser's), drop the journal or create objects of its own.

``roles_script()`` is that arrangement as one psql script, run once by a superuser on an empty
database: the Helm chart's PostgreSQL runs it at ``initdb`` (``files/ledger-roles.psql``), and
an operator of an external server runs it with ``psql -v ledger_user=… -v ledger_schema=… -v
ledger_password=… -f``. psql's ``:"name"`` and ``:'name'`` quote each variable, so a value is an
identifier or a literal and never SQL.

Privileges, table by table (what ``cluster/ledger/book.py`` and ``holds.py`` run):

==========  =======================  ====================================================
table       the client may           why not more
==========  =======================  ====================================================
accounts    SELECT, INSERT, UPDATE   an account is never deleted (its journal refers to it)
journal     SELECT, INSERT           append-only; the triggers refuse the rest as well
holds       SELECT, INSERT, UPDATE   a hold closes by UPDATE; never deleted
==========  =======================  ====================================================

Identity columns draw from their sequences without a grant (PostgreSQL checks none for them).
"""

from __future__ import annotations

from cluster.ledger.postgres_schema import TABLES

__all__ = ["OWNER_SUFFIX", "roles_script"]

# The owning role is the client's name plus this: one pair per ledger, findable by name.
OWNER_SUFFIX = "_owner"

GRANTS = (
    ("accounts", "SELECT, INSERT, UPDATE"),
    ("journal", "SELECT, INSERT"),
    ("holds", "SELECT, INSERT, UPDATE"),
)


def roles_script() -> str:
    """The psql script: roles, the schema owned by the owner, the tables created as the owner,
    the client's grants. Variables: ``ledger_user``, ``ledger_schema``, ``ledger_password``."""
    lines = [
        "-- The ledger's roles and schema (cluster/ledger/postgres_roles.py); run once, as a",
        "-- superuser, on an empty database:",
        "--   psql -v ON_ERROR_STOP=1 -v ledger_user=U -v ledger_schema=S "
        "-v ledger_password=P -f this",
        "\\set ON_ERROR_STOP on",
        f"\\set ledger_owner :ledger_user '{OWNER_SUFFIX}'",
        'CREATE ROLE :"ledger_owner" NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;',
        'CREATE ROLE :"ledger_user" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT',
        "  NOREPLICATION NOBYPASSRLS PASSWORD :'ledger_password';",
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC;",
        'CREATE SCHEMA :"ledger_schema" AUTHORIZATION :"ledger_owner";',
        'SET ROLE :"ledger_owner";',
        'SET search_path TO :"ledger_schema";',
    ]
    lines += [statement.strip() + ";" for statement in TABLES]
    lines += [
        "RESET ROLE;",
        'GRANT USAGE ON SCHEMA :"ledger_schema" TO :"ledger_user";',
        *(f'GRANT {rights} ON {table} TO :"ledger_user";' for table, rights in GRANTS),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m cluster.ledger.postgres_roles > helm/.../ledger-roles.psql
    import sys

    sys.stdout.write(roles_script())
