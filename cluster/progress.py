"""Progress bars that appear only where a person is watching.

A bar is drawn on standard error when it is a terminal, or when asked for (``--progress``);
``--quiet`` always wins. Logs and CI output therefore stay free of carriage-return noise.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm import tqdm

__all__ = ["progress_bar", "progress_wanted"]

T = TypeVar("T")


def progress_wanted(progress: bool | None = None, quiet: bool = False) -> bool:
    """Whether to draw: never when ``quiet``; else ``progress`` if given; else stderr is a TTY."""
    if quiet:
        return False
    if progress is not None:
        return progress
    return sys.stderr.isatty()


def progress_bar(
    iterable: Iterable[T] | None = None,
    *,
    progress: bool | None = None,
    quiet: bool = False,
    **kwargs: Any,  # tqdm's own keywords (tqdm leaves them untyped)
) -> tqdm[T]:
    """A ``tqdm`` on stderr, disabled unless :func:`progress_wanted` says otherwise."""
    return tqdm(iterable, file=sys.stderr, disable=not progress_wanted(progress, quiet), **kwargs)
