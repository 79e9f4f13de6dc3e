"""Flags of ``disaggctl experiment``: bad values stop before any work, with status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from disaggctl.cli import build_parser, main


@pytest.mark.parametrize(
    "argv",
    [
        ["experiment", "poa", "--trials", "0"],
        ["experiment", "all", "--quick", "--write-docs"],
        ["experiment", "poa", "--quick", "--write-docs"],
    ],
)
def test_bad_flags_exit_2(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "disaggctl:" in capsys.readouterr().err


def test_unknown_experiment_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["experiment", "nope"])
    assert exc.value.code == 2


def test_help_lists_the_experiments() -> None:
    text = build_parser().format_help()
    assert "experiment" in text
