"""Whether the optional Dynamo backend is installed, and how to install it.

Dynamo is not a dependency of the project (``make demo`` runs without it): ``pip install
ai-dynamo`` fails on Python 3.11 because its dependency ``aisimulate`` comes from an unreachable
index, so ``make dynamo`` installs it in three steps (docs/design.md §6 "Dynamo"). Everything that
starts a Dynamo process calls :func:`require_dynamo` first, so a missing install is one clear
message with the command to run, never an ``ImportError`` deep inside a worker.
"""

from __future__ import annotations

import importlib.util

__all__ = [
    "DYNAMO_VERSION",
    "INSTALL_COMMANDS",
    "DynamoMissingError",
    "dynamo_available",
    "require_dynamo",
]

DYNAMO_VERSION = "1.6.1"
INSTALL_COMMANDS = (
    f"python -m pip install ai-dynamo-runtime=={DYNAMO_VERSION}",
    "python -m pip install -e '.[dev,dynamo]'",
    f"python -m pip install --no-deps ai-dynamo=={DYNAMO_VERSION}",
)


class DynamoMissingError(RuntimeError):
    """The optional Dynamo backend is asked for but not installed."""


def dynamo_available() -> bool:
    """True when ``dynamo`` and its mocker can be imported (neither is imported here)."""
    try:
        return (
            importlib.util.find_spec("dynamo") is not None
            and importlib.util.find_spec("dynamo.mocker") is not None
        )
    except (ImportError, ValueError):  # a broken or half-installed namespace package
        return False


def require_dynamo() -> None:
    """Raise :class:`DynamoMissingError`, naming the install command, unless Dynamo is there."""
    if dynamo_available():
        return
    steps = "\n".join(f"  {c}" for c in INSTALL_COMMANDS)
    raise DynamoMissingError(
        f"the optional Dynamo backend (ai-dynamo=={DYNAMO_VERSION}) is not installed; "
        f"run `make dynamo` in the project root, which runs, in the project's venv:\n{steps}"
    )
