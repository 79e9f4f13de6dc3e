"""The tiny model's tokenizer laid out as a Hugging Face hub cache entry, for tools that take a
tokenizer by repo id offline (docs/design.md §8 "Real traces": NVIDIA's aiperf)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

__all__ = ["HUB_FILES", "default_hf_home", "hub_cache_entry", "hub_repo_id"]


HUB_FILES = (
    "config.json", "generation_config.json", "special_tokens_map.json", "tokenizer.json",
    "tokenizer_config.json",
)  # fmt: skip


def hub_repo_id(model_dir: Path) -> str:
    """The Hugging Face repo id the tiny model is laid out under: ``disaggctl/<dir name>``."""
    return f"disaggctl/{Path(model_dir).name}"


def default_hf_home() -> Path:
    """``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/disaggctl/hf``: the hub cache of our tiny models."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "disaggctl" / "hf"


def hub_cache_entry(model_dir: Path, hf_home: Path | None = None) -> str:
    """Lay ``model_dir``'s tokenizer and config out as a Hugging Face hub cache entry under
    ``hf_home`` (default :func:`default_hf_home`) and return its repo id.

    Offline, tools that take a tokenizer by repo id (NVIDIA's aiperf resolves ``--tokenizer``
    with ``snapshot_download(local_files_only=True)``) find it there: ``HF_HOME=<hf_home>
    HF_HUB_OFFLINE=1 aiperf ... --tokenizer <repo id>`` (docs/design.md §8). The layout is the
    hub's own: ``hub/models--ORG--NAME/snapshots/<40 hex>/`` holding the files, ``refs/main``
    holding that hex, here the SHA-1 of the files, so a rebuilt model gets a new snapshot.
    Idempotent; written to a temporary sibling and renamed, as ``build_model_dir`` does."""
    model_dir, home = Path(model_dir), Path(hf_home or default_hf_home())
    repo = hub_repo_id(model_dir)
    digest = hashlib.sha1(usedforsecurity=False)
    files = {name: (model_dir / name).read_bytes() for name in HUB_FILES}
    for name, data in files.items():
        digest.update(name.encode() + b"\0" + data)
    revision = digest.hexdigest()
    entry = home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = entry / "snapshots" / revision
    if not snapshot.is_dir():
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".snapshot.", dir=snapshot.parent))
        try:
            for name, data in files.items():
                (tmp / name).write_bytes(data)
            try:
                os.rename(tmp, snapshot)
            except OSError:
                if not snapshot.is_dir():  # not another writer's identical snapshot
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    (entry / "refs").mkdir(parents=True, exist_ok=True)
    ref = entry / "refs" / "main"
    if not ref.is_file() or ref.read_text() != revision:
        staged = ref.with_name(f".main.{uuid.uuid4().hex}")
        staged.write_text(revision)
        os.replace(staged, ref)
    return repo
