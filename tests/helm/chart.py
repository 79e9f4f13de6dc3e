"""Helpers of the chart tests: where the chart is, finding helm (``.venv/bin/helm`` from ``make
test``, or one on PATH), running it, ``helm template`` renders cached per set of values."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "disaggctl"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
RELEASE = "disagg"
NAMESPACE = "disagg-test"
LOOK_ONLY = ("--set", "generatedSecrets.offline=generate")


def find_helm() -> str | None:
    local = Path(sys.executable).parent / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    venv = ROOT / ".venv" / "bin" / "helm"
    if venv.is_file() and os.access(venv, os.X_OK):
        return str(venv)
    return shutil.which("helm")


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm, *args], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "HELM_CACHE_HOME": "/tmp/helm-cache", "HELM_CONFIG_HOME":
             "/tmp/helm-config", "HELM_DATA_HOME": "/tmp/helm-data"},
    )  # fmt: skip


@functools.cache
def render_chart(
    helm: str, files: tuple[str, ...], sets: tuple[str, ...]
) -> tuple[dict[str, Any], ...]:
    # Offline, so the chart would refuse to generate passwords: these renders are looked at only.
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *LOOK_ONLY]
    for f in files:
        args += ["-f", f]
    for s in sets:
        args += ["--set", s]
    out = run_helm(helm, *args)
    if out.returncode != 0:
        raise AssertionError(f"helm template {' '.join(args[3:])} failed:\n{out.stderr}")
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)
