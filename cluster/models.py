"""The one base for every shape that crosses an edge: config files, CLI values, HTTP bodies, events.

Every edge model derives from :class:`StrictModel`: strict types (``"1"`` is not ``1``, ``true`` is
not ``1.0``), no NaN or infinity, no unknown keys, frozen once built. A failure is reported by
:func:`describe_error` as one line per bad field, each naming the field's path and, where the
input came from a file or a flag, that source too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "ConfigError",
    "SecretInputError",
    "StrictModel",
    "describe_error",
    "load_yaml_model",
    "validate_model",
]

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Strict, finite, closed and immutable: the default for every edge shape in the project."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid", frozen=True)


class ConfigError(ValueError):
    """A value rejected at an edge; the message names the source and every bad field."""


class SecretInputError(ValueError):
    """A validator's refusal of a value that holds a secret (a password in a URL): the error
    names the field and the reason, never the value."""


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def describe_error(exc: ValidationError, source: str | None = None) -> str:
    """One line per failed field: ``source: field.path: message (got value)``."""
    prefix = f"{source}: " if source else ""
    lines = []
    for err in exc.errors(include_url=False):
        got = err.get("input")
        shown = repr(got)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        where = _path(tuple(err["loc"]))
        secret = isinstance(err.get("ctx", {}).get("error"), SecretInputError)
        got_part = "" if err["type"] == "missing" or secret else f" (got {shown})"
        lines.append(f"{prefix}{where}: {err['msg']}{got_part}")
    return "\n".join(lines)


def validate_model(model: type[M], data: object, source: str | None = None) -> M:
    """``model.model_validate(data)``, raising :class:`ConfigError` that names source and fields."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_error(exc, source)) from None


def load_yaml_model(model: type[M], path: str | Path, *, max_bytes: int = 1 << 20) -> M:
    """Read a YAML file (at most ``max_bytes``) into ``model``; every error names the file."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    if size > max_bytes:
        raise ConfigError(f"{path}: {size} bytes, more than the {max_bytes} allowed")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return validate_model(model, data, str(path))
