"""`rollout-shards build ... --trainer slime` as a user runs it (a subprocess), against
slime's own conversion of the same rows; slime's settings checks as usage errors; where
slime's rollout-id rule differs from miles'."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rollout_shards_loader import slime as slime_loader

from tests.support import slime as ss
from tests.support.cli import cli
from tests.support.samples import sample, write_step
from tests.support.slime_cases import CASES


def flags(settings: dict[str, Any]) -> list[str]:
    """The settings as slime's own flags."""
    out: list[str] = []
    for name, value in settings.items():
        if name in ("rewards_normalization", "grpo_std_normalization") and value is False:
            out.append(f"--disable-{name.replace('_', '-')}")
        elif value is True:
            out.append(f"--{name.replace('_', '-')}")
        else:
            out += [f"--{name.replace('_', '-')}", str(value)]
    return out


@pytest.mark.parametrize("name", ["balance_dynamic_moe", "cp2_dynamic", "no_normalization"])
def test_cli_build_is_slimes_dict(slime: Any, tmp_path: Path, name: str) -> None:
    rows, settings = CASES[name]
    write_step(tmp_path / "in", copy.deepcopy(rows))
    done = cli(
        "build", tmp_path / "in", "--out", tmp_path / "out", "--trainer", "slime", *flags(settings)
    )
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "out" / "step=1"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["settings"]["trainer"] == "slime"
    theirs = ss.rank_dicts(slime, settings, copy.deepcopy(rows))
    ours = [slime_loader.read_rank(folder, r) for r in range(len(theirs))]
    assert [ss.canonical(d) for d in ours] == [ss.canonical(d) for d in theirs]


def _build_four_rows(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`build --trainer slime --global-batch-size 2 EXTRA` of a step of four rows."""
    write_step(tmp_path / "in", [sample(i) for i in range(4)])
    return cli(
        "build",
        tmp_path / "in",
        "--out",
        tmp_path / "out",
        "--trainer",
        "slime",
        "--global-batch-size",
        "2",
        *extra,
    )


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--use-dynamic-global-batch-size"], "use_dynamic_global_batch_size"),
        (["--disable-rollout-trim-samples"], "disable_rollout_trim_samples"),
        (["--allow-partial-train-step"], "allow_partial_train_step"),
        (["--q-lora-rank", "8"], "q_lora_rank"),
        (["--balance-by-flops"], "balance_by_flops needs use_dynamic_batch_size"),
        (["--balance-data"], "set num_layers"),
    ],
)
def test_settings_slime_does_not_take_are_usage_errors(
    tmp_path: Path, extra: list[str], named: str
) -> None:
    done = _build_four_rows(tmp_path, "--rollout-batch-size", "4", *extra)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_slime_needs_its_rollout_batch_size(tmp_path: Path) -> None:
    done = _build_four_rows(tmp_path)
    assert done.returncode == 2
    assert "rollout_batch_size" in done.stderr


def test_slime_rollout_id_rule(tmp_path: Path) -> None:
    """slime's validate_rollout_id_annotated: ids allowed on singletons (miles refuses
    them), but every leaf of a multi-leaf call needs one."""
    singles = [sample(0, rollout_id=5), sample(1), sample(2), sample(3)]
    write_step(tmp_path / "a", singles)
    common = [
        "--global-batch-size",
        "2",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
    ]
    miles = cli("build", tmp_path / "a", "--out", tmp_path / "m", *common[:2])
    assert miles.returncode == 1 and "rollout_id_only_on_v2_multi_leaf" in miles.stderr
    ok = cli("build", tmp_path / "a", "--out", tmp_path / "s", "--trainer", "slime", *common)
    assert ok.returncode == 0, ok.stderr
    leaves = [sample(0, 0, session_version="v2", rollout_id=3), sample(0, 1, session_version="v2")]
    write_step(tmp_path / "b", leaves + [sample(1), sample(2)])
    bad = cli("build", tmp_path / "b", "--out", tmp_path / "t", "--trainer", "slime", *common)
    assert bad.returncode == 1 and "rollout_id_on_multi_leaf" in bad.stderr


def test_num_steps_per_rollout_gives_slimes_global_batch_size(tmp_path: Path) -> None:
    """slime derives global_batch_size = rollout_batch_size * n_samples_per_prompt //
    num_steps_per_rollout, and asserts a given one equals it."""
    write_step(tmp_path / "in", [sample(i, group_index=i // 2) for i in range(8)])
    common = ["--trainer", "slime", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2"]
    ok = cli(
        "build", tmp_path / "in", "--out", tmp_path / "a", *common, "--num-steps-per-rollout", "2"
    )
    assert ok.returncode == 0, ok.stderr
    manifest = json.loads((tmp_path / "a" / "step=1" / "manifest.json").read_text())
    assert manifest["global_batch_size"] == 4 and manifest["num_train_steps"] == 2
    bad = cli(
        "build",
        tmp_path / "in",
        "--out",
        tmp_path / "b",
        *common,
        "--num-steps-per-rollout",
        "2",
        "--global-batch-size",
        "2",
    )
    assert bad.returncode == 2 and "num_steps_per_rollout" in bad.stderr
