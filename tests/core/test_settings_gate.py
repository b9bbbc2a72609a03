"""`validate` as a gate a CI can trust, and flags a user can get wrong, run as a user runs
them (the CLI as a subprocess): `validate` reads a settings file exactly as `build` does,
so with the same settings its exit 0 means `build` does not refuse them; a mistyped or
misspelled flag names the one meant."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import cli
from tests.support.samples import REPO

DATA = REPO / "data" / "rollouts"
USAGE = "rollout-shards: usage error: "


def usage_line(result: subprocess.CompletedProcess[str]) -> str:
    (line,) = result.stderr.splitlines()
    assert line.startswith(USAGE), result.stderr
    return line.removeprefix(USAGE)


# Settings files `build` refuses, and a phrase of its one usage line.
REFUSED = {
    "foo: 3\n": "settings.yaml: unknown setting foo",
    "global-batch-size: 16\n": (
        "settings.yaml: unknown setting global-batch-size (did you mean global_batch_size?)"
    ),
    "global_batch_sise: 16\n": (
        "unknown setting global_batch_sise (did you mean global_batch_size?)"
    ),
    "disable-rewards-normalization: true\n": ("(did you mean disable_rewards_normalization?)"),
    "dp_size: two\n": "dp_size: Input should be a valid integer",
    "dp_size: 0\n": "dp_size: Input should be greater than or equal to 1",
    "cp_size: 2\n": "cp_size turns on the rollout-side schedule",
    "trainer: nemo\n": "trainer: 'nemo' is not a trainer",
    "use_dynamic_global_batch_size: true\ndisable_rollout_trim_samples: true\n": (
        "use_dynamic_global_batch_size needs trimming"
    ),
}


@pytest.mark.parametrize("rows_only", [False, True], ids=["batch", "rows_only"])
@pytest.mark.parametrize("text", list(REFUSED))
def test_validate_refuses_the_settings_build_refuses(
    tmp_path: Path, text: str, rows_only: bool
) -> None:
    """With a global batch size (the data root's settings file gives one) `validate` says
    what `build` says; without one (`rows_only`) it checks the rows alone, and still every
    setting it was given, as `build` does (which needs the batch size besides)."""
    data, batch = DATA, []
    if rows_only:  # build needs the batch size validate goes without
        data, batch = tmp_path / "rollouts", ["--global-batch-size", "8"]
        shutil.copytree(DATA, data, ignore=shutil.ignore_patterns("rollout-shards.yaml"))
        text += "reward_key: score\n"
    config = tmp_path / "settings.yaml"
    config.write_text(text)
    built = cli("build", data, "--out", tmp_path / "out", "--config", config, *batch)
    assert built.returncode == 2, built.stderr
    assert REFUSED[text.removesuffix("reward_key: score\n")] in usage_line(built)
    assert not (tmp_path / "out").exists()
    validated = cli("validate", data, "--config", config)
    assert validated.returncode == 2, validated.stderr
    assert usage_line(validated) == usage_line(built)
    assert validated.stdout == ""


def test_validate_exit_0_means_build_takes_the_settings(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("global_batch_size: 8\ndp_size: 2\nbalance_data: true\n")
    validated = cli("validate", DATA, "--config", config)
    assert validated.returncode == 0, validated.stderr
    built = cli("build", DATA, "--out", tmp_path / "out", "--config", config)
    assert built.returncode == 0, built.stderr
    assert "usage error" not in built.stderr


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--global-batch-sise", "8"],
            "unrecognized arguments: --global-batch-sise 8: did you mean --global-batch-size?",
        ),
        (
            ["--global-batch-size", "8", "--dp_sise", "2", "--balanse-data"],
            "unrecognized arguments: --dp_sise 2 --balanse-data: did you mean --dp-size (for "
            "--dp_sise), --balance-data (for --balanse-data)?",
        ),
        (
            ["--global-batch-size", "8", "--balance-data", "true"],
            "--balance-data is a switch and takes no value ('true'): give --balance-data alone",
        ),
        (
            ["--global-batch-size", "8", "--disable-rewards-normalization=no"],
            "--disable-rewards-normalization is a switch and takes no value ('no'): give "
            "--disable-rewards-normalization alone",
        ),
    ],
)
def test_a_flag_given_wrong_names_the_flag_meant(
    tmp_path: Path, flags: list[str], line: str
) -> None:
    result = cli("build", DATA, "--out", tmp_path / "out", *flags)
    assert result.returncode == 2
    assert usage_line(result) == f"{line} (see rollout-shards --help)"
    assert not (tmp_path / "out").exists()


def test_the_settings_file_spelling_of_a_flag_is_taken(tmp_path: Path) -> None:
    """`--global_batch_size 8 --dp_size=2 --balance_data` builds what the dashed flags do."""
    dashed = cli(
        "build", DATA, "--out", tmp_path / "a", "--global-batch-size", "8", "--dp-size=2",
        "--balance-data",
    )  # fmt: skip
    spelled = cli(
        "build", DATA, "--out", tmp_path / "b", "--global_batch_size", "8", "--dp_size=2",
        "--balance_data",
    )  # fmt: skip
    assert dashed.returncode == spelled.returncode == 0, spelled.stderr
    for manifest in sorted((tmp_path / "a").glob("step=*/manifest.json")):
        twin = tmp_path / "b" / manifest.relative_to(tmp_path / "a")
        assert twin.read_text() == manifest.read_text()
