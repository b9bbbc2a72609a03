"""docs/settings.example.yaml, the example settings file the README says to copy into an
input root: the common settings, then a section per trainer with every setting it reads,
each under its description and at its default (but for what the trainer requires); it
builds as it is with `--trainer miles`, `slime` and `verl`, end to end through the CLI.
And where a setting's value came from: named in an error, dropped by `--unset`."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline import trainers
from pipeline.settings import CommonSettings, load_settings
from tests.support.cli import cli
from tests.support.samples import REPO, sample, write_step

EXAMPLE = REPO / "docs" / "settings.example.yaml"
# What each trainer requires, set in the example for a step of 8 rows in groups of 4.
REQUIRED = {
    "miles": {"global_batch_size": 8},
    "slime": {"global_batch_size": 8, "rollout_batch_size": 2, "n_samples_per_prompt": 4},
    "verl": {
        "rollout_n": 4,
        "train_batch_size": 2,
        "max_prompt_length": 1024,
        "max_response_length": 1024,
        "pad_token_id": 0,
    },
}


def _described(text: str, name: str, description: str, indent: str) -> None:
    above = text.split(f"\n{indent}{name}: ")[0].rsplit("\n\n", 1)[-1]
    said = " ".join(line.strip().removeprefix("# ") for line in above.splitlines()).strip()
    assert said.startswith(description), name


def test_the_example_lists_every_setting_of_every_trainer() -> None:
    text = EXAMPLE.read_text()
    written = yaml.safe_load(text)
    common = dataclasses.fields(CommonSettings)
    assert list(written) == [f.name for f in common] + list(trainers.NAMES)
    for f in common:
        assert written[f.name] == f.default, f.name
        _described(text, f.name, f.metadata["description"], "")
    for name in trainers.NAMES:
        own = dataclasses.fields(trainers.settings_model(name))
        assert list(written[name]) == [f.name for f in own], name
        assert written[name] == {f.name: f.default for f in own} | REQUIRED[name], name
        section = text.split(f"\n{name}:\n")[1]
        for f in own:
            _described(section, f.name, f.metadata["description"], "  ")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A step of 8 rows in prompt groups of 4, with the example as its root's settings,
    copied as the README says."""
    rows = [sample(i, group_index=i // 4, reward=float(i % 3)) for i in range(8)]
    write_step(tmp_path / "rollouts", rows)
    shutil.copy(EXAMPLE, tmp_path / "rollouts" / "rollout-shards.yaml")
    return tmp_path / "rollouts"


@pytest.mark.parametrize("trainer", trainers.NAMES)
def test_the_example_builds_for_every_trainer_as_it_is(root: Path, trainer: str) -> None:
    out = root.parent / "out"
    done = cli("build", str(root), "--out", str(out), "--trainer", trainer)
    assert done.returncode == 0, done.stderr
    manifest = yaml.safe_load((out / "step=1" / "manifest.json").read_text())
    assert manifest["settings"]["trainer"] == trainer
    for name, value in REQUIRED[trainer].items():
        assert manifest["settings"][name] == value
    assert manifest["counts"]["written"] == 8
    validated = cli("validate", str(root), "--trainer", trainer)
    assert validated.returncode == 0, validated.stderr
    assert "step 1: valid, 8 rows, 8 would be written" in validated.stdout


def test_an_error_names_where_the_value_came_from(root: Path) -> None:
    """A miles setting at the top of the root's file, with --trainer verl: the one line
    names the file and the key; from a section, the section's key; from a flag, the flag."""
    settings = root / "rollout-shards.yaml"
    settings.write_text(
        settings.read_text().replace(
            "dp_size: 1\n", "dp_size: 1\nuse_dynamic_global_batch_size: true\n", 1
        )
    )
    done = cli("build", str(root), "--out", str(root.parent / "out"), "--trainer", "verl")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert (
        "use_dynamic_global_batch_size: not a setting of the verl trainer" in done.stderr
        and f"(given in {settings}, key use_dynamic_global_batch_size)" in done.stderr
    ), done.stderr
    section = cli(
        "validate",
        str(root),
        "--trainer",
        "verl",
        "--unset",
        "use-dynamic-global-batch-size",
        "--dp-size",
        "3",
    )
    assert section.returncode == 2
    assert "dp_size=3 equal parts" in section.stderr
    assert " and flag --dp-size)" in section.stderr, section.stderr
    text = settings.read_text().replace("  rollout_n: 4\n", "  rollout_n: 0\n")
    settings.write_text(text)
    wrong = cli(
        "validate", str(root), "--trainer", "verl", "--unset", "use_dynamic_global_batch_size"
    )
    assert wrong.returncode == 2
    assert (
        "rollout_n: Input should be greater than or equal to 1 "
        f"(given in {settings}, key verl.rollout_n)" in wrong.stderr
    ), wrong.stderr


def test_unset_drops_a_value_from_a_file(root: Path) -> None:
    settings = root / "rollout-shards.yaml"
    settings.write_text(settings.read_text() + "global_batch_size: 4\n")
    # the top-level miles value is foreign to verl: unset, the build goes on
    refused = cli("validate", str(root), "--trainer", "verl")
    assert refused.returncode == 2 and "key global_batch_size)" in refused.stderr
    done = cli("validate", str(root), "--trainer", "verl", "--unset", "global_batch_size")
    assert done.returncode == 0, done.stderr
    # miles' own section ranks above the key beside it: 8, not 4; unset drops both
    assert load_settings(data_configs=[settings]).global_batch_size == 8
    rows_only = cli("validate", str(root), "--unset", "global_batch_size")
    assert rows_only.returncode == 0, rows_only.stderr
    assert "rows valid, 8 rows (batch not checked)" in rows_only.stdout
    both = cli("validate", str(root), "--unset", "dp_size", "--dp-size", "2")
    assert both.returncode == 2 and "--unset dp_size and a value" in both.stderr
    unknown = cli("validate", str(root), "--unset", "dp_sise")
    assert unknown.returncode == 2 and "did you mean dp_size" in unknown.stderr


def test_a_section_holds_only_what_its_trainer_reads(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text("verl:\n  global_batch_size: 8\n")
    with pytest.raises(
        Exception, match=r"config .*settings.yaml: verl: not a verl setting global_batch_size"
    ):
        load_settings(path)
    path.write_text("slime:\n  - 1\n")
    with pytest.raises(Exception, match="slime: a mapping of the slime trainer's settings"):
        load_settings(path)


def test_a_run_config_value_is_named_as_run_config() -> None:
    """Dagster's run config hands its settings as `load_settings` overrides, worded as
    run config keys (`orchestration/resources.py`)."""
    with pytest.raises(Exception, match=r"dp_size: .* \(given in run config key dp_size\)$"):
        load_settings(source="run config key {name}", global_batch_size=8, dp_size=0)
