from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from disaggctl import demo as demo_mod
from disaggctl import system_demo
from disaggctl.cli import build_parser, main
from disaggctl.jsonout import strict_dumps
from disaggctl.options import MAX_CONCURRENCY, MAX_HOLD_S, MAX_N, MAX_USERS


def strict_json(text: str) -> Any:
    """Parse as any non-Python JSON parser would: NaN / Infinity are errors."""

    def reject(token: str) -> None:
        raise AssertionError(f"non-standard JSON constant {token}")

    return json.loads(text, parse_constant=reject)


def usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``argv``, expect exit status 2 with a message and no traceback; return stderr."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""  # rejected before any work: no result, no progress
    assert "Traceback" not in err
    return err


def test_auction_command_prints_an_order_and_prices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["auction", "--workload", "chains", "--n", "32", "--users", "4"]) == 0
    report = strict_json(capsys.readouterr().out)
    assert report["n"] == 32 and report["scheduler"] == "dfs-bid"
    assert len(report["first"]) == 5 and report["welfare_pct_above_half"] > 0
    # The five largest payments are part of the revenue, which also counts everyone else's.
    assert report["revenue"] >= sum(report["top_payments"].values()) - 1e-9 > 0


def test_auction_command_runs_a_queue_in_batches_on_the_simulator(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["auction", "--workload", "trees-short", "--queue", "96", "--n", "32"]
    argv += ["--value-model", "correlated", "--rho", "0.5", "--quiet"]
    assert main(argv) == 0
    planned = strict_json(capsys.readouterr().out)
    assert (planned["queue"], planned["n"], planned["batches"]) == (96, 32, 3)
    assert planned["values"] == "correlated(rho=0.5)" and "cache_hit_rate" not in planned
    assert main([*argv, "--simulate"]) == 0
    report = strict_json(capsys.readouterr().out)
    # The simulated figures come beside the planned ones, which do not change.
    assert {k: report[k] for k in planned} == planned
    assert 0 < report["cache_hit_rate"] < 1 and report["mean_ttft_s"] > 0
    assert -100 <= report["realised_welfare_pct_above_half"] <= 100
    assert report["simulator"] == {"profile": "h100-32b", "topology": "0P/1D"}


def test_sim_run_command_reports_a_closed_loop_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "run", "--concurrency", "8", "--seconds", "5"]) == 0
    report = strict_json(capsys.readouterr().out)
    assert report["completed"] > 0 and report["itl_p99_s"] > 0


def test_sim_run_normalises_the_topology(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["sim", "run", "--topology", " 1p/2d ", "--concurrency", "4", "--seconds", "2"]) == 0
    )
    assert strict_json(capsys.readouterr().out)["topology"] == "1P/2D"


def test_sim_run_defaults_to_the_profiles_topology_and_reports_poa(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """h100-32b is one aggregated GPU (0P/1D), not the 70B study's 1P/5D; poa_hat and its two
    factors come per phase and for the hold, from the estimator scenarios and serve mode run."""
    assert (
        main(["sim", "run", "--profile", "h100-32b", "--concurrency", "8", "--seconds", "5"]) == 0
    )
    report = strict_json(capsys.readouterr().out)
    assert report["topology"] == "0P/1D" and report["completed"] > 0
    assert [p["phase"] for p in report["phases"]] == ["warmup", "hold"]
    hold = report["phases"][-1]
    assert (hold["prefill_workers"], hold["decode_workers"]) == (0, 1)
    for key in ("poa_hat", "poa_routing", "poa_capacity"):
        assert report[key] == hold[key] >= 1.0
    assert report["poa_routing"] == 1.0  # one worker: nothing to route
    argv = ["sim", "run", "--profile", "h100-32b", "--topology", "1p/1d"]
    assert main([*argv, "--concurrency", "2", "--seconds", "2"]) == 0
    assert strict_json(capsys.readouterr().out)["topology"] == "1P/1D"  # a given one wins


def test_sim_run_figures_are_the_calibrations_the_estimator_only_observes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cluster.sim.calibration import run_point
    from cluster.sim.profile import load_profile

    assert main(["sim", "run", "--concurrency", "16", "--seconds", "5", "--seed", "3"]) == 0
    report = strict_json(capsys.readouterr().out)
    summary = run_point(load_profile("b200-llama70b-fp8-tp4"), "1P/5D", 16, 5.0, 3)
    assert {k: report[k] for k in summary.as_dict()} == summary.as_dict()


def test_sim_run_json_is_strict_when_nothing_was_measured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No request finishes in a 1 s hold at C = 1 (340B, 5.7 s per request): percentiles are
    NaN, which used to be printed as the invalid JSON token NaN; they are null now."""
    argv = ["sim", "run", "--profile", "b200-nemotron340b-fp8-tp8"]
    assert main([*argv, "--concurrency", "1", "--seconds", "1"]) == 0
    out = capsys.readouterr().out
    report = strict_json(out)
    assert report["completed"] == 0 and report["ttft_p99_s"] is None
    assert "NaN" not in out


def test_strict_dumps_never_writes_nan() -> None:
    import numpy as np

    text = strict_dumps({"a": float("nan"), "b": [np.float64("inf"), 1.5], "c": np.int64(3)})
    assert strict_json(text) == {"a": None, "b": [None, 1.5], "c": 3}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sim", "run", "--seconds", "nan"], "--seconds must be a finite number, got nan"),
        (["sim", "run", "--seconds", "inf"], "--seconds must be a finite number, got inf"),
        (["sim", "run", "--seconds", "0"], "--seconds must be >= 1"),
        (["sim", "run", "--seconds", "1e9"], f"--seconds must be <= {MAX_HOLD_S}"),
        (["sim", "run", "--concurrency", "0"], "--concurrency must be >= 1, got 0"),
        (["sim", "run", "--concurrency", "-5"], "--concurrency must be >= 1, got -5"),
        (
            ["sim", "run", "--concurrency", "100000000"],
            f"--concurrency must be <= {MAX_CONCURRENCY}, got 100000000",
        ),
        (["sim", "run", "--topology", "1P/100000D"], "--topology must have 1 to 32 decode"),
        (["sim", "run", "--topology", "100P/1D"], "--topology must have 0 to 16 prefill"),
        (["sim", "run", "--topology", "five"], "--topology must look like xP/yD"),
        (["sim", "run", "--seed", "-1"], "--seed must be >= 0, got -1"),
        (["auction", "--n", "1000000"], f"--n must be <= {MAX_N}, got 1000000"),
        (["auction", "--users", "1000000"], f"--users must be <= {MAX_USERS}"),
        (["auction", "--n", "0"], "--n must be >= 1, got 0"),
        (["auction", "--workload", "nope"], "--workload must be one of mixshare-P"),
        (["auction", "--workload", "mixshare-150"], "--workload must be one of"),
        (["auction", "--top", "-1"], "--top must be >= 0"),
        (["auction", "--queue", "0"], "--queue must be >= 1, got 0"),
        (["auction", "--rho", "0.5"], "--rho applies to --value-model correlated only"),
        (["auction", "--value-model", "correlated", "--rho", "2"], "--rho must be <= 1"),
        (["auction", "--value-model", "correlated", "--rho", "nan"], "--rho must be a finite"),
        (["demo", "--n", "0"], "--n must be >= 1, got 0"),
        (["demo", "--users", "0"], "--users must be >= 1, got 0"),
    ],
)
def test_bad_values_name_the_flag_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    err = usage_error(capsys, argv)
    assert f"disaggctl: {message}" in err, err


def test_every_bad_flag_is_reported_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(capsys, ["sim", "run", "--seconds", "nan", "--concurrency", "0"])
    assert "--seconds" in err and "--concurrency" in err


def test_demo_checks_its_output_folder_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="n must be between 1"):
        demo_mod.run_demo(n=0)  # was a ZeroDivisionError

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo started although --out cannot be written")

    monkeypatch.setattr(system_demo, "run", no_work)
    monkeypatch.setattr(demo_mod, "run_demo", no_work)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    err = usage_error(capsys, ["demo", "--out", str(blocker / "out")])
    assert "disaggctl: --out must be a folder that can be written" in err, err
    # The Python entry point checks the same, before work, naming the field.
    with pytest.raises(ValueError, match="out: Value error, must be a folder"):
        demo_mod.main(blocker / "out", 1024, 128, 0)
    with pytest.raises(ValueError, match="n: Input should be greater than or equal to 1"):
        demo_mod.main(tmp_path / "ok", 0, 128, 0)


def test_runtime_errors_end_with_a_message_and_status_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import disaggctl.sim_cli as sim_cli

    def broken(name: str) -> None:
        raise ValueError(f"{name}.yaml: prefill.a_s: Input should be a finite number (got nan)")

    monkeypatch.setattr(sim_cli, "load_profile", broken)
    assert main(["sim", "run"]) == 1
    assert "disaggctl: b200-llama70b-fp8-tp4.yaml: prefill.a_s" in capsys.readouterr().err


def parsers(
    parser: argparse.ArgumentParser, path: str = "disaggctl"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{path} {name}")


def walk(parser: argparse.ArgumentParser, path: str = "disaggctl") -> Iterator[tuple[str, Any]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                assert helps.get(name), f"{path} {name} has no help line"
                yield from walk(child, f"{path} {name}")
        else:
            yield path, action


def test_every_option_of_every_subcommand_has_help_and_shows_its_default() -> None:
    seen = set()
    for path, action in walk(build_parser()):
        if not action.option_strings:
            continue
        seen.add(f"{path} {action.option_strings[-1]}")
        assert action.help and action.help != argparse.SUPPRESS, (path, action.option_strings)
    assert {"disaggctl demo --out", "disaggctl sim run --seconds", "disaggctl auction --n"} <= seen
    for sub in ("demo", "auction", "sim run", "sim calibrate"):
        assert {f"disaggctl {sub} --quiet", f"disaggctl {sub} --progress"} <= seen
    every = dict(parsers(build_parser()))
    assert {"disaggctl", "disaggctl demo", "disaggctl sim calibrate"} <= set(every)
    for path, parser in every.items():
        assert "usage:" in parser.format_help(), path  # a stray % in a help line raises here
    run = every["disaggctl sim run"]
    text = run.format_help()
    assert "(default: 64)" in text and f"1 to {MAX_CONCURRENCY}" in text
    flat = " ".join(text.split())
    assert "default: the profile's default_topology" in flat and "h100-32b 0P/1D" in flat


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"disaggctl {version('disaggctl')}"


def test_quiet_and_progress(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "run", "--concurrency", "4", "--seconds", "2"]
    assert main([*argv, "--progress"]) == 0
    both = capsys.readouterr()
    assert "simulated s" in both.err and strict_json(both.out)["concurrency"] == 4
    assert main([*argv, "--progress", "--quiet"]) == 0  # quiet wins
    quiet = capsys.readouterr()
    assert quiet.err == "" and strict_json(quiet.out)["concurrency"] == 4
    assert main(argv) == 0  # not a terminal here: no bar unless asked
    assert capsys.readouterr().err == ""
    assert main(["auction", "--n", "16", "--users", "2", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_calibrate_prints_its_table_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "calibrate", "--profile", "h100-32b", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "kv_capacity_tokens" in out and "28128" in out and " ok" in out
    assert err == ""


def test_a_reader_that_quits_early_is_not_a_traceback() -> None:
    """`disaggctl ... | head -1`: the closed pipe ends the command quietly with status 141."""
    import subprocess
    import sys

    script = (
        "import sys; from disaggctl.cli import main; "
        "sys.exit(main(['auction', '--n', '64', '--quiet']))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command writes its first byte
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err
