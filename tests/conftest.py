"""The whole suite's NATS credentials: one set per test session (``cluster.nats_auth``).

Named in the environment before anything starts, so every nats-server a test starts is
configured with them and every process it starts (Ray's workers, ``disaggctl serve`` in a
subprocess, Dynamo's processes) finds them, as a deployment's processes would."""

from __future__ import annotations

import os
import shutil
import tempfile

from cluster.nats_auth import CREDENTIALS_ENV, generate_credentials

_CREDENTIALS = tempfile.mkdtemp(prefix="disagg-creds-")
generate_credentials(_CREDENTIALS)
os.environ[CREDENTIALS_ENV] = _CREDENTIALS


def pytest_unconfigure() -> None:
    shutil.rmtree(_CREDENTIALS, ignore_errors=True)
