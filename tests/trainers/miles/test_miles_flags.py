"""miles' other data-path flags (docs/miles.md): each followed exactly or refused in one
usage line naming it and why; inputs miles trains on that the shards cannot carry refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import main
from pipeline.errors import StepError, UsageError
from pipeline.io.formats.miles import read_miles_dump
from pipeline.settings import load_settings
from pipeline.trainers.miles.flags import parse_layer_pattern
from tests.support.miles_dump import sample_dict, write_dump
from tests.support.samples import build, sample, write_step

SCHEDULED = {
    "global_batch_size": 4,
    "dp_size": 2,
    "cp_size": 1,
    "use_dynamic_batch_size": True,
    "max_tokens_per_gpu": 9,
}


@pytest.mark.parametrize(
    ("values", "words"),
    [
        (
            {"custom_reward_post_process_path": "my.rewards.post"},
            "custom_reward_post_process_path runs a user's Python function",
        ),
        (
            {"custom_convert_samples_to_train_data_path": "my.convert"},
            "custom_convert_samples_to_train_data_path runs a user's Python function",
        ),
        ({"multi_lora_n_adapters": 2}, "multi_lora_n_adapters > 0 trains adapters"),
        ({"num_steps_per_rollout": 2}, "num_steps_per_rollout needs rollout_batch_size"),
        (
            {"num_steps_per_rollout": 2, "rollout_batch_size": 4, "n_samples_per_prompt": 4},
            "global_batch_size=8 is not rollout_batch_size * n_samples_per_prompt // "
            "num_steps_per_rollout = 16 // 2 = 8",
        ),
    ],
)
def test_refused_in_one_usage_line_naming_the_flag(values: dict[str, Any], words: str) -> None:
    if "num_steps_per_rollout" in values and "rollout_batch_size" in values:
        values = {**values, "num_steps_per_rollout": 3}
        words = words.replace("// 2 = 8", "// 3 = 5")
    with pytest.raises(UsageError) as error:
        load_settings(global_batch_size=8, **values)
    assert words in str(error.value)


def test_num_steps_per_rollout_gives_the_global_batch_size() -> None:
    s = load_settings(num_steps_per_rollout=2, rollout_batch_size=4, n_samples_per_prompt=4)
    assert s.global_batch_size == 8
    assert load_settings(num_steps_per_rollout=4, rollout_batch_size=8).global_batch_size == 2
    assert load_settings(global_batch_size=8, num_steps_per_rollout=2, rollout_batch_size=16)


def test_the_command_line_refuses_with_status_2(tmp_path: Path, capsys: Any) -> None:
    write_step(tmp_path / "in", [sample(i) for i in range(4)])
    args = ["build", str(tmp_path / "in"), "--out", str(tmp_path / "out")]
    status = main([*args, "--global-batch-size", "2", "--multi-lora-n-adapters", "1"])
    assert status == 2
    assert "multi_lora_n_adapters" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("step=*"))


def _rows() -> list[dict[str, Any]]:
    return [sample(i, response_length=1 + i % 5, reward=float(i % 2)) for i in range(16)]


@pytest.mark.parametrize(
    "split_on_trainer",
    [
        {"delay_split_train_data_by_dp": True},
        {"use_fault_tolerance": True, "ft_components": ["rollout", "train"]},
    ],
)
def test_a_split_on_the_trainer_is_the_plain_split(
    split_on_trainer: dict[str, Any], tmp_path: Path
) -> None:
    """miles then splits in `process_rollout_data` with `split_train_data_by_dp_raw`:
    strided ranks whatever cp_size says (the rank files of a build without cp_size)."""
    write_step(tmp_path / "in", _rows())
    delayed = build(tmp_path / "in", tmp_path / "delayed", **SCHEDULED, **split_on_trainer)
    plain = {k: v for k, v in SCHEDULED.items() if k != "cp_size"}
    expected = build(tmp_path / "in", tmp_path / "plain", **plain)
    scheduled = build(tmp_path / "in", tmp_path / "scheduled", **SCHEDULED)
    assert delayed["num_microbatches"] is None
    sha = [o["sha256"] for o in delayed["outputs"]]
    assert sha == [o["sha256"] for o in expected["outputs"]]
    assert sha != [o["sha256"] for o in scheduled["outputs"]]


def test_fault_tolerance_of_the_rollout_alone_keeps_the_schedule(tmp_path: Path) -> None:
    write_step(tmp_path / "in", _rows())
    ft = build(tmp_path / "in", tmp_path / "ft", **SCHEDULED, use_fault_tolerance=True)
    # ft_components without use_fault_tolerance is ignored, as miles ignores it
    ignored = build(tmp_path / "in", tmp_path / "ignored", **SCHEDULED, ft_components=["train"])
    assert ft["num_microbatches"] is not None and ignored["num_microbatches"] is not None


@pytest.mark.parametrize("column", ["multimodal_train_inputs", "adapter"])
def test_inputs_the_shards_cannot_carry_are_refused(column: str, tmp_path: Path) -> None:
    rows = [sample(i, **{column: "x" if i == 2 else None}) for i in range(4)]
    write_step(tmp_path / "in", rows)
    with pytest.raises(StepError) as error:
        build(tmp_path / "in", tmp_path / "out", global_batch_size=2)
    assert error.value.violations[0].rule == "input_not_carried"
    assert column in error.value.violations[0].message
    # all null: miles adds no key and schedules as usual
    write_step(tmp_path / "null", [sample(i, **{column: None}) for i in range(4)])
    assert build(tmp_path / "null", tmp_path / "built", global_batch_size=2)["counts"]["written"]


def test_a_dump_with_multimodal_train_inputs_is_refused(tmp_path: Path) -> None:
    import torch

    samples = [sample_dict(index=i) for i in range(2)]
    samples[1]["multimodal_train_inputs"] = {"pixel_values": torch.zeros(2, 3)}
    path = write_dump(tmp_path / "rollout_data" / "1.pt", 1, samples)
    with pytest.raises(StepError) as error:
        read_miles_dump(path)
    assert error.value.violations[0].rule == "input_not_carried"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4", 4),
        ("[0,1,1,1]", [0, 1, 1, 1]),
        ("([0]+[1]*3)", [0, 1, 1, 1]),
        ("([1]*3+[0]*1)*2", [1, 1, 1, 0, 1, 1, 1, 0]),
    ],
)
def test_moe_layer_freq_reads_megatrons_patterns(text: str, value: Any) -> None:
    assert parse_layer_pattern(text) == value


@pytest.mark.parametrize("text", ["__import__('os')", "[1]*", "1.5", "[1]*(10**9)", "x"])
def test_moe_layer_freq_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="not an integer or a layer pattern"):
        parse_layer_pattern(text)


def test_settings_file_and_run_config_take_the_flags(tmp_path: Path) -> None:
    from pipeline.orchestration.run_config import BuildConfig

    config = tmp_path / "rollout-shards.yaml"
    config.write_text(
        "global_batch_size: 4\nuse_dynamic_batch_size: true\nmax_tokens_per_gpu: 64\n"
        "balance_by_flops: true\nnum_layers: 4\nhidden_size: 64\nffn_hidden_size: 128\n"
        "num_attention_heads: 8\nvocab_size: 1000\nnum_experts: 8\n"
        "moe_layer_freq: [0, 1, 1, 1]\nmax_weight_staleness: 2\nft_components: [train]\n"
    )
    s = load_settings(config=config)
    assert (s.balance_by_flops, s.moe_layer_freq, s.max_weight_staleness) == (
        True,
        [0, 1, 1, 1],
        2,
    )
    assert s.ft_components == ["train"]
    run = BuildConfig(moe_layer_freq="([0]+[1]*3)", ft_components=["train"], num_layers=4)
    assert run.overrides() == {
        "num_layers": 4,
        "moe_layer_freq": [0, 1, 1, 1],
        "ft_components": ["train"],
    }
    with pytest.raises(UsageError, match="moe_layer_freq"):
        BuildConfig(moe_layer_freq="[1]*").overrides()
    with pytest.raises(UsageError, match="ft_components"):
        load_settings(global_batch_size=1, ft_components=["everything"])
