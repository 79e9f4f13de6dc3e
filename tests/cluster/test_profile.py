"""Hardware profiles reject every bad value at load time, naming the file and the field
(docs/design.md §6): non-finite numbers anywhere, negative tolerances, ranges that are not
[low <= high], bad topologies, unknown metrics, an architecture that disagrees with the KV bytes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.models import ConfigError, StrictModel
from cluster.sim.calibration import check, point_value
from cluster.sim.profile import (
    MEASURED_METRICS,
    PROFILE_DIR,
    CalibrationPoint,
    CalibrationSpec,
    DecodeModel,
    DecodeSpec,
    HardwareProfile,
    LinkModel,
    LinkSpec,
    PrefillModel,
    PrefillSpec,
    ProfileSpec,
    WorkloadShape,
    WorkloadSpec,
    available_profiles,
    load_profile,
    normalise_topology,
    parse_profile,
)
from cluster.sim.records import Summary


def raw_profile(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text())
    return data


def write(tmp_path: Path, raw: dict[str, Any], name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def float_leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every number in a profile (ints too: a YAML .nan can land in any numeric field)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from float_leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from float_leaves(v, (*path, i))
    elif isinstance(node, int | float) and not isinstance(node, bool):
        yield path


def set_at(raw: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        raw = raw[key]
    raw[path[-1]] = value


def dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@pytest.mark.parametrize("name", available_profiles())
def test_every_number_in_every_profile_rejects_nan_and_inf(name: str, tmp_path: Path) -> None:
    leaves = list(float_leaves(raw_profile(name)))
    assert len(leaves) >= 30  # every cost, limit and link figure (and any published point)
    # Each leaf with one of the three in turn: every leaf refuses a non-finite value, and each
    # of nan, inf and -inf is refused on every kind of field (the check is the field type's).
    for i, path in enumerate(leaves):
        bad = (math.nan, math.inf, -math.inf)[i % 3]
        raw = raw_profile(name)
        set_at(raw, path, bad)
        file = write(tmp_path, raw)
        with pytest.raises(ConfigError) as err:
            load_profile(file)
        message = str(err.value)
        assert str(file) in message, message
        # the field's path, less the published-value union's tag
        assert dotted(path) in message.replace(".number", "").replace(".range", ""), message


def test_profiles_load_and_normalise() -> None:
    for name in available_profiles():
        profile = load_profile(name)
        # The mocker's profile has no published figures: Dynamo's replay is its reference
        # (tests/dynamo/test_crosscheck.py); every hardware profile has its measurements.
        assert bool(profile.calibration) == (name != "dynamo-mocker"), name
        assert isinstance(profile.calibration, tuple)
        for point in profile.calibration:
            assert point.topology == normalise_topology(point.topology)
            assert isinstance(point.value, float | tuple)


@pytest.mark.parametrize(
    ("change", "field", "phrase"),
    [
        ({"tolerance": -0.1}, "tolerance", "greater than or equal to 0"),
        ({"value": [1.0, 2.0, 3.0]}, "value", "a range is [low, high], 2 numbers, not 3"),
        ({"value": [128, 96]}, "value", "low > high"),
        ({"value": [96]}, "value", "2 numbers, not 1"),
        ({"topology": "five"}, "topology", "xP/yD"),
        ({"topology": "1P/0D"}, "topology", "decode workers"),
        ({"topology": "1P/100000D"}, "topology", "decode workers"),
        ({"metric": "goodput"}, "metric", "throughput_rps"),
        ({"concurrency": -1}, "concurrency", "greater than or equal to 0"),
        ({"concurrency": 0}, "concurrency", "must be >= 1 for throughput_rps"),
        ({"value": 0.0}, "value", "greater than 0"),
    ],
)
def test_bad_calibration_points_name_the_file_and_field(
    tmp_path: Path, change: dict[str, Any], field: str, phrase: str
) -> None:
    raw = raw_profile("b200-llama70b-fp8-tp4")
    raw["calibration"][0].update(change)
    file = write(tmp_path, raw)
    with pytest.raises(ConfigError) as err:
        load_profile(file)
    message = str(err.value)
    assert str(file) in message and "calibration[0]" in message and field in message, message
    assert phrase in message, message


def test_topologies_are_normalised() -> None:
    assert normalise_topology(" 1p / 5d ") == "1P/5D"
    assert normalise_topology("0P/1D") == "0P/1D"
    point = CalibrationPoint(" 2p/3d ", "throughput_rps", 64, [10, 20])  # type: ignore[arg-type]
    assert point.topology == "2P/3D" and point.value == (10, 20)


def test_hand_built_records_are_checked_too() -> None:
    with pytest.raises(ValueError, match=r"PrefillModel\.a_s: must be a finite number"):
        PrefillModel(math.nan, 1e-5, 0.02, 0.1, 8192, 64, 1000)
    with pytest.raises(ValueError, match=r"LinkModel\.bandwidth_gbps: must be > 0"):
        LinkModel(0.0, 0.0)
    with pytest.raises(ValueError, match=r"CalibrationPoint\.metric"):
        CalibrationPoint("1P/1D", "goodput", 8, 1.0)
    with pytest.raises(ValueError, match="tolerance"):
        CalibrationPoint("1P/1D", "throughput_rps", 8, 1.0, tolerance=-0.5)
    profile = load_profile("b200-llama70b-fp8-tp4")
    with pytest.raises(ValueError, match=r"HardwareProfile\.tp"):
        dataclasses.replace(profile, tp=0)


def test_an_unknown_metric_is_a_message_not_a_crash() -> None:
    profile = load_profile("b200-llama70b-fp8-tp4")
    with pytest.raises(ValueError, match="unknown calibration metric 'goodput'"):
        point_value(profile, "1P/2D", 8, "goodput")
    # Every metric a profile may name is one check() can compute.
    summary_fields = {f.name for f in dataclasses.fields(Summary)}
    assert set(MEASURED_METRICS) <= summary_fields


def test_the_architecture_must_agree_with_the_kv_bytes(tmp_path: Path) -> None:
    raw = raw_profile("h100-32b")
    raw["architecture"]["kv_dtype_bytes"] = 1  # FP8 KV with BF16 bytes per token stated
    file = write(tmp_path, raw)
    with pytest.raises(ConfigError, match=r"architecture: .*131072 bytes per token.*262144"):
        load_profile(file)
    raw = raw_profile("h100-32b")
    del raw["memory"]
    with pytest.raises(ConfigError, match="kv_capacity_tokens point needs architecture and memory"):
        load_profile(write(tmp_path, raw))


def test_query_heads_come_in_whole_groups_per_kv_head(tmp_path: Path) -> None:
    raw = raw_profile("h100-32b")
    raw["architecture"]["heads"] = 42  # 8 KV heads cannot each serve 5.25 query heads
    with pytest.raises(
        ConfigError, match=r"architecture: .*heads 42 is not a multiple of kv_heads 8"
    ):
        load_profile(write(tmp_path, raw))


def test_every_profile_states_its_attention_cost_and_default_topology(tmp_path: Path) -> None:
    """No silent zero: a profile without e or without a default topology does not load."""
    expected = {
        "b200-llama70b-fp8-tp4": "1P/5D",
        "b200-nemotron340b-fp8-tp8": "1P/2D",
        "dynamo-mocker": "1P/5D",
        "h100-32b": "0P/1D",
    }
    assert {n: load_profile(n).default_topology for n in available_profiles()} == expected
    for name in available_profiles():
        # The mocker's timing has no per-pair attention term (its quadratic is on a pass's
        # total tokens, f_s_per_iteration_token_sq); every hardware profile states e > 0.
        mocker = name == "dynamo-mocker"
        prefill = load_profile(name).prefill
        assert (prefill.e_s_per_token_pair > 0) != mocker, name
        assert (prefill.f_s_per_iteration_token_sq > 0) == mocker, name
    raw = raw_profile("h100-32b")
    del raw["prefill"]["e_s_per_token_pair"], raw["default_topology"]
    with pytest.raises(ConfigError) as err:
        load_profile(write(tmp_path, raw))
    assert "prefill.e_s_per_token_pair: Field required" in str(err.value)
    assert "default_topology: Field required" in str(err.value)
    raw = raw_profile("h100-32b")
    raw["default_topology"] = " 0p / 2d "
    assert load_profile(write(tmp_path, raw)).default_topology == "0P/2D"
    raw["default_topology"] = "0P/0D"
    with pytest.raises(ConfigError, match=r"default_topology: .*must have 1 to 32 decode workers"):
        load_profile(write(tmp_path, raw))


def test_a_free_iteration_is_rejected(tmp_path: Path) -> None:
    """Zero prefill cost (or d0 = 0) would never advance simulated time: a hang, not a run."""
    raw = raw_profile("b200-nemotron340b-fp8-tp8")  # a_s is already 0 there
    raw["prefill"].update(b_s_per_token=0.0, c_s_per_request=0.0)
    with pytest.raises(ConfigError, match="cannot all be 0"):
        load_profile(write(tmp_path, raw))
    raw = raw_profile("b200-nemotron340b-fp8-tp8")
    raw["decode"]["d0_s"] = 0.0
    with pytest.raises(ConfigError, match=r"decode\.d0_s: Input should be greater than 0"):
        load_profile(write(tmp_path, raw))


def test_unknown_and_missing_fields(tmp_path: Path) -> None:
    raw = raw_profile("h100-32b")
    raw["decode"]["d3_s"] = 1.0
    with pytest.raises(ConfigError, match=r"decode\.d3_s: Extra inputs are not permitted"):
        load_profile(write(tmp_path, raw))
    with pytest.raises(ValueError, match=r"where\.link\.latency_s: missing field"):
        parse_profile(dict(raw_profile("h100-32b"), link={"bandwidth_gbps": 1.0}), where="where")


def test_each_record_has_exactly_its_specs_fields() -> None:
    """The dataclasses the simulator reads and the models that check them cannot drift apart."""
    pairs: list[tuple[Any, type[StrictModel]]] = [
        (PrefillModel, PrefillSpec),
        (DecodeModel, DecodeSpec),
        (LinkModel, LinkSpec),
        (WorkloadShape, WorkloadSpec),
        (CalibrationPoint, CalibrationSpec),
        (HardwareProfile, ProfileSpec),
    ]
    for record, spec in pairs:
        assert [f.name for f in dataclasses.fields(record)] != []
        assert {f.name for f in dataclasses.fields(record)} == set(spec.model_fields), record


def test_check_runs_every_point_of_a_profile_without_crashing() -> None:
    (result,) = check(load_profile("h100-32b"))
    assert result.point.metric == "kv_capacity_tokens" and math.isfinite(result.simulated)


def test_each_profile_states_its_models_context() -> None:
    """The served context is the model's own (its config's max_position_embeddings)."""
    from cluster.serve.app import MAX_BODY_BYTES, body_limit

    contexts = {name: load_profile(name).context_tokens for name in available_profiles()}
    assert contexts == {
        "b200-llama70b-fp8-tp4": 131_072,
        "b200-nemotron340b-fp8-tp8": 4096,
        "dynamo-mocker": 131_072,  # no model: the traces' longest prompt and output fit
        "h100-32b": 32_768,
    }
    # A whole context of token ids fits the body (2 MiB at 131,072 tokens), never below 1 MiB.
    assert body_limit(131_072) == 2 * MAX_BODY_BYTES and body_limit(4096) == MAX_BODY_BYTES
    raw = yaml.safe_load(PROFILE_DIR.joinpath("b200-llama70b-fp8-tp4.yaml").read_text())
    with pytest.raises(ConfigError, match="context_tokens"):
        parse_profile({**raw, "context_tokens": 100})
    raw.pop("context_tokens")
    with pytest.raises(ConfigError, match="context_tokens: missing field"):
        parse_profile(raw)


def test_a_profile_may_declare_a_switch_without_a_restart(tmp_path: Path) -> None:
    profile = load_profile("b200-llama70b-fp8-tp4")
    kv_both = profile.with_kv_both()
    assert profile.role_switch_s == 30.0 and profile.kv_both_switch_s == 1.0
    assert kv_both.role_switch_s == 1.0 and kv_both.name == "b200-llama70b-fp8-tp4+kv_both"
    assert dataclasses.replace(kv_both, name=profile.name, role_switch_s=30.0) == profile
    with pytest.raises(ValueError, match="declares no kv_both_switch_s"):
        load_profile("h100-32b").with_kv_both()
    raw = raw_profile("b200-llama70b-fp8-tp4")
    raw["kv_both_switch_s"] = 0.0
    with pytest.raises(ConfigError, match="kv_both_switch_s: Input should be greater than 0"):
        load_profile(write(tmp_path, raw))
