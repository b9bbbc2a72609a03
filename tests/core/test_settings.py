"""The settings model (a dataclass; pydantic reads and words what is not of its exact
type), how `make_settings` words its problems, and the strict reading of a settings YAML
file."""

from __future__ import annotations

import dataclasses
import itertools
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import UsageError
from pipeline.settings import (
    CommonSettings,
    RowSettings,
    Settings,
    SettingsError,
    load_settings,
    make_row_settings,
    make_settings,
    non_null,
    read_config,
    setting_defaults,
    setting_fields,
    setting_types,
)
from pipeline.yaml_config import MAX_DEPTH, ConfigError, load_mapping


def problems(values: dict[str, Any]) -> str:
    with pytest.raises(UsageError) as excinfo:
        make_settings(values)
    return str(excinfo.value).removeprefix("invalid settings: ")


def test_make_settings_names_every_problem_then_the_inconsistency() -> None:
    assert problems({"dp_size": "8", "balance_data": "maybe", "foo": 1}) == (
        "dp_size: Input should be a valid integer; "
        "balance_data: Input should be a valid boolean, unable to interpret input; "
        "foo: Extra inputs are not permitted"
    )
    # the trainer's own requirements come once the values are well typed
    assert problems({"dp_size": 8}) == (
        "global_batch_size: required by the miles trainer (miles' --global-batch-size): give "
        "--global-batch-size, or global_batch_size in --config or in the input root's "
        "rollout-shards.yaml"
    )
    assert problems({"global_batch_size": 6, "dp_size": 4}).startswith(
        "global_batch_size=6 must be divisible by dp_size=4"
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (0, "Input should be greater than or equal to 1"),
        (True, "Input should be a valid integer"),  # integers are strict
        (8.0, "Input should be a valid integer"),
        ("8", "Input should be a valid integer"),
        (None, "required by the miles trainer"),  # its profile's check, in our words
        ([8], "Input should be a valid integer"),
    ],
)
def test_counts_are_strict_integers(value: Any, problem: str) -> None:
    assert problems({"global_batch_size": value}).startswith(f"global_batch_size: {problem}")


@pytest.mark.parametrize(
    ("value", "read"),
    [("yes", True), ("No", False), ("TRUE", True), ("off", False), (1, True), (0, False)],
)
def test_booleans_are_read_as_pydantic_reads_them(value: Any, read: bool) -> None:
    assert make_settings({"global_batch_size": 8, "balance_data": value}).balance_data is read


def test_choices_and_texts() -> None:
    assert problems({"global_batch_size": 8, "advantage_estimator": "dpo"}) == (
        "advantage_estimator: Input should be 'grpo', 'gspo', 'cispo', 'reinforce_plus_plus', "
        "'reinforce_plus_plus_baseline' or 'ppo'"
    )
    assert problems({"global_batch_size": 8, "reward_key": 3}) == (
        "reward_key: Input should be a valid string"
    )
    assert make_settings({"global_batch_size": 8, "reward_key": "score"}).reward_key == "score"


def test_each_inconsistency_is_refused() -> None:
    base: dict[str, Any] = {"global_batch_size": 8}
    for changes, start in [
        ({"use_dynamic_global_batch_size": True, "disable_rollout_trim_samples": True}, "use_"),
        ({"use_dynamic_batch_size": True}, "use_dynamic_batch_size needs max_tokens_per_gpu"),
        ({"cp_size": 2}, "cp_size turns on the rollout-side schedule"),
        ({"vpp_size": 2}, "vpp_size > 1 needs microbatch_group_size_per_vp_stage"),
    ]:
        assert problems(base | changes).startswith(start), changes


def test_settings_are_frozen_and_checked_when_replaced() -> None:
    settings = Settings(global_batch_size=8, dp_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.dp_size = 4  # type: ignore[misc]
    with pytest.raises(SettingsError, match="dp_size: Input should be a valid integer"):
        Settings(global_batch_size=8, dp_size="2")  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="foo: Extra inputs are not permitted"):
        settings.replace(foo=1)
    assert settings.replace(global_batch_size=4).global_batch_size == 4
    with pytest.raises(ValueError, match="must be divisible"):
        settings.replace(global_batch_size=3)
    assert settings.to_json().startswith('{"trainer":"miles","dp_size":2,"reward_key":null,')
    # run options (stream_above, ray_address, ray_above) change no output byte: not
    # recorded; nor are the settings of another trainer: the common settings, then miles'
    common = [f.name for f in dataclasses.fields(CommonSettings)]
    miles = [f.name for f in dataclasses.fields(settings.own)]
    options = ("stream_above", "ray_address", "ray_above")
    assert list(settings.to_dict()) == [n for n in common if n not in options] + miles
    assert list(settings.values()) == common + miles
    assert "rollout_n" in [name for name, _, _ in setting_fields()]  # verl's, not miles'
    assert "rollout_n" not in settings.values()


def test_setting_fields_give_what_the_flags_and_run_config_need() -> None:
    fields = {name: (kind, text) for name, kind, text in setting_fields()}
    assert non_null(fields["micro_batch_size"][0]) is int
    assert non_null(fields["balance_data"][0]) is bool
    assert fields["dp_size"][1] == "Data-parallel ranks, one shard file each."
    assert all(text for _, text in fields.values())
    assert set(setting_types()) == set(fields)


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as excinfo:
        load_mapping(text)
    return str(excinfo.value)


def test_a_key_given_twice_is_refused_naming_it() -> None:
    assert refused("global_batch_size: 8\ndp_size: 2\nglobal_batch_size: 4\n") == (
        " gives setting global_batch_size twice, on lines 1 and 3: keep one"
    )
    assert "the key 'b' is given twice" in refused("reward_key: {b: 1, b: 2}\n")


@pytest.mark.parametrize(
    ("text", "older", "newer"),
    [
        ("1:04", "64", "the text '1:04'"),  # base 60 in YAML 1.1
        ("010", "8", "10"),  # octal in YAML 1.1
        ("-010", "-8", "-10"),
        ("1_000", "1000", "the text '1_000'"),
        ("0b11", "3", "the text '0b11'"),
        ("0o17", "the text '0o17'", "15"),
        ("1e3", "the text '1e3'", "1000.0"),
        ("08", "the text '08'", "8"),
        ("1:30.5", "90.5", "the text '1:30.5'"),
    ],
)
def test_a_value_yaml_1_1_reads_otherwise_is_refused(text: str, older: str, newer: str) -> None:
    assert refused(f"global_batch_size: {text}\n") == (
        f", setting global_batch_size: {text!r} reads as {older} in YAML 1.1 and as {newer} "
        "in YAML 1.2: write the value you mean, or quote a text"
    )


def test_values_both_versions_agree_on_are_read() -> None:
    text = "a: 8\nb: -3\nc: 0x1F\nd: 1.5\ne: .inf\nf: ~\ng: true\nh: yes\ni: '010'\nj: 007\n"
    read = load_mapping(text)
    assert read == {
        "a": 8, "b": -3, "c": 31, "d": 1.5, "e": math.inf, "f": None, "g": True, "h": "yes",
        "i": "010", "j": 7,
    }  # fmt: skip
    assert load_mapping("") == {} and load_mapping("# nothing\n") == {}


def test_integers_beyond_int64_are_refused_without_reading_their_digits() -> None:
    message = refused("global_batch_size: " + "9" * 5000 + "\n")
    assert message.startswith(", setting global_batch_size: the integer '99999")
    assert message.endswith("(5000 chars)' is beyond int64")
    assert "beyond int64" in refused(f"dp_size: {2**63}\n")
    assert load_mapping(f"dp_size: {-(2**63)}\n") == {"dp_size": -(2**63)}


@pytest.mark.parametrize(
    "value",
    ["[" * 50_000 + "]" * 50_000, "{a: " * 50_000 + "1" + "}" * 50_000],
)
def test_deep_nesting_is_refused_naming_the_setting(value: str) -> None:
    assert refused(f"dp_size: {value}\n") == (
        f", setting dp_size: nested more than {MAX_DEPTH} levels deep"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- 8\n", " must be a mapping of setting names to values"),
        ("8\n", " must be a mapping of setting names to values"),
        ("a: 1\n---\nb: 2\n", " holds more than one YAML document"),
        ("1: 2\n", " has the key 1 on line 1: a setting name is a text"),
        ("a: !!python/object:os.system x\n", ", setting a: the tag "),
        ("a: *nowhere\n", ", setting a: the alias *nowhere is not defined"),
        ("a: [\n", " is not valid YAML: "),
    ],
)
def test_other_shapes_are_refused(text: str, message: str) -> None:
    assert refused(text).startswith(message)


def test_read_config_turns_a_refusal_into_one_usage_line(tmp_path: Path) -> None:
    path = write(tmp_path, "dp_size: 2\ndp_size: 4\n")
    with pytest.raises(UsageError) as excinfo:
        read_config(path)
    assert str(excinfo.value) == (
        f"config {path} gives setting dp_size twice, on lines 1 and 2: keep one"
    )
    assert "\n" not in str(excinfo.value)


def test_disable_flags_in_a_file(tmp_path: Path) -> None:
    path = write(tmp_path, "global_batch_size: 8\ndisable_rewards_normalization: true\n")
    assert load_settings(path).rewards_normalization is False
    path = write(tmp_path, "global_batch_size: 8\ndisable_grpo_std_normalization: 'false'\n")
    assert load_settings(path).grpo_std_normalization is True  # the text read as a boolean
    path = write(tmp_path, "disable_rewards_normalization: maybe\n")
    with pytest.raises(UsageError, match="disable_rewards_normalization: Input should be a valid"):
        read_config(path)
    path = write(tmp_path, "rewards_normalization: true\ndisable_rewards_normalization: true\n")
    with pytest.raises(UsageError, match="sets both rewards_normalization and disable_"):
        read_config(path)


def test_settings_rank_defaults_data_file_config_then_flags(tmp_path: Path) -> None:
    data = write(tmp_path, "global_batch_size: 4\ndp_size: 2\nbalance_data: true\n", "d.yaml")
    config = write(tmp_path, "dp_size: 4\n")
    settings = load_settings(config, [data], global_batch_size=8, reward_key=None)
    assert (settings.global_batch_size, settings.dp_size, settings.balance_data) == (8, 4, True)


@pytest.mark.parametrize(
    "text",
    [
        "a: !!python/object/apply:os.getcwd []\n",
        "a: !!python/object:x {b: 1}\n",
        "a: !custom 1\n",
        "!!python/object:x {a: 1}\n",
    ],
)
def test_tags_are_refused_on_values_and_collections(text: str) -> None:
    assert "is not read: write a plain value" in refused(text)
    assert load_mapping("a: !!str 010\nb: !!seq [1]\nc: !!map {d: 1}\n") == {
        "a": "010",
        "b": [1],
        "c": {"d": 1},
    }


def test_a_name_with_a_newline_stays_on_one_line(tmp_path: Path) -> None:
    assert problems({"global_batch_size": 8, "dp\nsize": 2}) == (
        "'dp\\nsize': Extra inputs are not permitted"
    )
    path = write(tmp_path, '"a\\nb": 1\n"a\\nb": 2\n')
    with pytest.raises(UsageError) as excinfo:
        read_config(path)
    assert "\n" not in str(excinfo.value) and "setting 'a\\nb' twice" in str(excinfo.value)


class _Reference(BaseModel):
    """The settings' fields as a plain pydantic model, the way `Settings` was declared
    before it became a dataclass: the reference for what is read and how it is worded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # the common settings first, then miles' (the contract's order)
    dp_size: int = Field(1, strict=True, ge=1)
    reward_key: str | None = None
    on_invalid: Literal["fail", "quarantine"] = "fail"
    global_batch_size: int | None = Field(None, strict=True, ge=1)
    advantage_estimator: Literal[
        "grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"
    ] = "grpo"
    balance_data: bool = False
    micro_batch_size: int | None = Field(None, strict=True, ge=1)


CANDIDATES: dict[str, list[Any]] = {
    "global_batch_size": [8, 0, -1, True, 8.0, "8", [8]],  # 2**70: test_beyond_int64
    "dp_size": [2, 0, False, 2.0, "2", None],
    "balance_data": [True, False, 1, 0, 2, 1.0, "yes", "off", "maybe", None, [True], b"true"],
    "advantage_estimator": ["gspo", "GSPO", "dpo", 3, None, b"grpo"],
    "reward_key": ["score", "", None, 3, 3.5, True, b"score", ["a"]],
    "micro_batch_size": [4, None, 0, "4", 4.0, True],
    "on_invalid": ["quarantine", "fail", "Fail", None, 1],
}


def _reference(values: dict[str, Any]) -> dict[str, Any] | str:
    try:
        return dict(_Reference.model_validate(values))
    except ValidationError as exc:
        return "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())


def _ours(values: dict[str, Any]) -> dict[str, Any] | str:
    try:
        settings = make_settings(values)
    except UsageError as exc:
        return str(exc).removeprefix("invalid settings: ")
    return {name: getattr(settings, name) for name in _Reference.model_fields}


@pytest.mark.parametrize("name", list(CANDIDATES))
def test_each_value_is_read_and_refused_as_pydantic_reads_it(name: str) -> None:
    """Differential: every candidate value of a setting, alone and beside a mistyped
    dp_size and an unknown name, read (or refused, with the same words) as a pydantic
    model of the same fields reads it; a value read is also of the same type."""
    base: dict[str, Any] = {"global_batch_size": 8}
    for value, extra in itertools.product(CANDIDATES[name], [{}, {"dp_size": "x", "z": 1}]):
        values = base | extra | {name: value}
        ours, reference = _ours(values), _reference(values)
        assert ours == reference, values
        if isinstance(ours, dict) and isinstance(reference, dict):
            assert [type(v) for v in ours.values()] == [type(v) for v in reference.values()]


def test_beyond_int64_is_refused_wherever_it_comes_from() -> None:
    """Not pydantic's reading (it takes any integer): a flag's value as a file's."""
    with pytest.raises(UsageError, match="^invalid settings: global_batch_size: the integer"):
        make_settings({"global_batch_size": 2**70})
    with pytest.raises(UsageError, match="moe_layer_freq: the integer -9223372036854775809 is"):
        make_settings({"global_batch_size": 8, "moe_layer_freq": [0, -(2**63) - 1]})


def test_the_row_settings_are_a_projection_of_the_settings() -> None:
    """Without what its batch needs (miles: a global batch size) the trainer checks the
    rows alone: every other setting is checked as `build` checks it, and the row settings
    are the settings' projection; with it, there are none (the batch is checked)."""
    row = make_row_settings({"on_invalid": "quarantine", "dp_size": 2})
    assert row == RowSettings(on_invalid="quarantine")
    assert row == Settings(global_batch_size=2, dp_size=2, on_invalid="quarantine").rows()
    for wrong in ({"dp_size": "x"}, {"z": 1}, {"on_invalid": "drop"}, {"balance_data": "x"}):
        with pytest.raises(UsageError, match="^invalid settings: "):
            make_row_settings(wrong)
    assert make_row_settings({"global_batch_size": 8}) is None
    assert make_row_settings({"trainer": "slime"}) is None  # slime's profile names what is missing
    no_std = Settings(global_batch_size=2, advantage_estimator="ppo").rows()
    assert no_std.normalizes_rewards is False
    assert setting_defaults()["on_invalid"] == RowSettings().on_invalid == "fail"
    assert setting_defaults()["global_batch_size"] is None  # the trainer's profile asks for it


def test_well_typed_settings_do_not_load_pydantic() -> None:
    """Pydantic is for what is not of its exact type: a build's usual settings (from
    flags, YAML or run config) are taken without importing it."""
    script = (
        "import sys\n"
        "from pipeline.settings import make_settings, make_row_settings\n"
        "make_settings({'global_batch_size': 8, 'dp_size': 2, 'balance_data': True,\n"
        "               'advantage_estimator': 'gspo', 'reward_key': 'score'})\n"
        "make_row_settings({'global_batch_size': 8, 'on_invalid': 'quarantine'})\n"
        "print('pydantic' in sys.modules)\n"
        "make_settings({'global_batch_size': 8, 'balance_data': 'yes'})\n"
        "print('pydantic' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "True"]
