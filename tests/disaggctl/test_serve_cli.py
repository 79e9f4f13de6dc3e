"""``disaggctl serve`` / ``status`` without a running service: flags, the status line read from
a /metrics text, and a clear error when nothing answers."""

from __future__ import annotations

import pytest

from cluster.nats_server import free_port
from disaggctl.cli import main
from disaggctl.serve_cli import format_status, parse_status

METRICS = """\
# TYPE disagg_regime gauge
disagg_regime 2.0
# TYPE disagg_router_temperature gauge
disagg_router_temperature 0.8
# TYPE disagg_router_overlap_weight gauge
disagg_router_overlap_weight 0.1
# TYPE disagg_poa_hat gauge
disagg_poa_hat 3.0
# TYPE disagg_poa_routing gauge
disagg_poa_routing 1.5
# TYPE disagg_poa_capacity gauge
disagg_poa_capacity 2.0
# TYPE disagg_ttft_p99_smoothed_seconds gauge
disagg_ttft_p99_smoothed_seconds 4.25
# TYPE disagg_auction_queue_depth gauge
disagg_auction_queue_depth 7.0
# TYPE disagg_auction_revenue counter
disagg_auction_revenue_total 12.5
# TYPE disagg_requests counter
disagg_requests_total{status="ok"} 90.0
disagg_requests_total{status="503"} 3.0
"""


def test_status_reads_regime_policy_poa_queue_and_revenue_from_metrics() -> None:
    s = parse_status(METRICS)
    assert s["regime"] == "saturated" and (s["tau"], s["omega"]) == (0.8, 0.1)
    assert (s["poa_hat"], s["poa_routing"], s["poa_capacity"]) == (3.0, 1.5, 2.0)
    assert s["queue_depth"] == 7.0 and s["revenue"] == 12.5 and s["requests"] == 93.0
    line = format_status(s)
    assert "regime saturated" in line and "poa_hat 3" in line and "revenue 12.50" in line


def test_a_service_that_has_not_reported_yet_prints_dashes() -> None:
    line = format_status(parse_status(""))
    assert "regime -" in line and "poa_hat -" in line


def test_status_without_a_service_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["status", "--url", url]) == 1
    assert f"disaggctl: no service at {url}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--port", "0"], "--port must be >= 1"),
        (["serve", "--users", "/nonexistent/users.yaml"], "--users must name an existing file"),
        (["status", "--url", "ftp://x"], "--url"),
        (["status", "--interval", "0"], "--interval must be >= 0.2"),
    ],
)
def test_bad_serve_and_status_flags_name_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_config_file_fails_before_anything_starts(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "serve.yaml"  # type: ignore[operator]
    bad.write_text("speedup: .nan\ntopology: 1P/0D\n")
    assert main(["serve", "--config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "speedup" in err and "topology" in err


def test_limit_flags_set_the_configs_limits_and_bad_ones_name_the_field() -> None:
    import argparse

    from cluster.config import DEFAULT_CONFIG
    from cluster.models import ConfigError
    from disaggctl.options import from_args
    from disaggctl.serve_cli import ServeOptions, add_parser, with_limit_flags

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(), argparse.HelpFormatter)
    args = parser.parse_args(["serve", "--user-rate", "5", "--anonymous-concurrency", "0"])
    config = with_limit_flags(DEFAULT_CONFIG, from_args(ServeOptions, args))
    assert (config.limits.user_rate, config.limits.anonymous_concurrency) == (5.0, 0)
    assert config.limits.paid_reserved_share == DEFAULT_CONFIG.limits.paid_reserved_share
    assert with_limit_flags(DEFAULT_CONFIG, from_args(ServeOptions, parser.parse_args(
        ["serve"]))) is DEFAULT_CONFIG  # fmt: skip
    bad = from_args(ServeOptions, parser.parse_args(["serve", "--user-rate", "-1"]))
    with pytest.raises(ConfigError, match=r"limits\.user_rate"):
        with_limit_flags(DEFAULT_CONFIG, bad)
