"""Without Dynamo installed, ``disaggctl serve --backend dynamo`` stops before starting anything,
naming the install command (status 1, no traceback)."""

from __future__ import annotations

import pytest

import cluster.backends.dynamo.install as install
from disaggctl.cli import main


def test_serve_backend_dynamo_without_dynamo_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(install, "dynamo_available", lambda: False)
    assert main(["serve", "--backend", "dynamo", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "make dynamo" in err and "ai-dynamo-runtime==1.6.1" in err
    assert "Traceback" not in err


def test_a_config_with_backend_dynamo_needs_a_prefill_pool_and_one_model_name() -> None:
    from cluster.config import ServeConfig

    with pytest.raises(ValueError, match="at least one prefill worker"):
        ServeConfig.model_validate({"backend": "dynamo", "topology": "0P/2D"})
    with pytest.raises(ValueError, match="must equal model_name"):
        ServeConfig.model_validate({"backend": "dynamo", "dynamo": {"model_name": "other"}})
    assert ServeConfig.model_validate({"dynamo": {"vllm_args": ["--tp", "4"]}}).backend == "sim"
