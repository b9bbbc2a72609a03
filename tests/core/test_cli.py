"""The command line as a user runs it: a subprocess, exit codes, stderr, files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.cli import cli, digests
from tests.support.samples import REPO, only_refused, sample, write_step

DATA = REPO / "data" / "rollouts"


def test_build_embedded_data_writes_every_step(tmp_path: Path) -> None:
    out = tmp_path / "shards"
    result = cli("build", DATA, "--out", out, "--global-batch-size", "8", "--dp-size", "2")
    assert result.returncode == 0, result.stderr
    # 1 of the 8 rows each of steps 2 and 4 trains on is truncated (their trimmed batches,
    # over which miles logs rollout/truncated_ratio): the alarm, and nothing else
    assert [line.partition(": warning: ")[::2] for line in result.stderr.splitlines()] == [
        (f"rollout-shards: build: step {step}", "12% of samples were truncated "
         "(rollout/truncated_ratio); a longer rollout max response length keeps them whole")
        for step in (2, 4)
    ]  # fmt: skip
    assert sorted(p.name for p in out.iterdir() if p.name != ".locks") == [
        "README.md",
        "step=1",
        "step=2",
        "step=3",
        "step=4",
    ]
    summaries = [line for line in result.stdout.splitlines() if " rows in, " in line]
    assert len(summaries) == 4
    # stdout holds the summary lines alone (no progress where stderr is no terminal)
    assert summaries == result.stdout.splitlines()
    assert "read and validate" not in result.stderr
    for folder in out.glob("step=*"):
        manifest = json.loads((folder / "manifest.json").read_text())
        n = manifest["counts"]
        assert n["ingested"] == n["quarantined"] + n["trimmed"] + n["dropped"] + n["written"]
        assert sorted(p.name for p in folder.glob("rank=*")) == ["rank=0.parquet", "rank=1.parquet"]
        assert sum(o["rows"] for o in manifest["outputs"]) == n["written"]
    step3 = json.loads((out / "step=3" / "manifest.json").read_text())
    assert step3["is_compact"] is True and step3["counts"]["trimmed"] == 0
    step4 = json.loads((out / "step=4" / "manifest.json").read_text())
    assert step4["is_compact"] is False and step4["counts"]["trimmed"] == 5


def test_build_is_byte_identical_on_rerun(tmp_path: Path) -> None:
    for name in ("a", "b"):
        assert cli("build", DATA, "--out", tmp_path / name).returncode == 0
    assert digests(tmp_path / "a") == digests(tmp_path / "b")
    # 4 manifests, 8 rank files, 4 reports, the dataset card
    assert len(digests(tmp_path / "a")) == 17


def test_validate_embedded_data_json(tmp_path: Path) -> None:
    result = cli("validate", DATA, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [entry["step"] for entry in report] == [1, 2, 3, 4]
    assert all(entry["valid"] for entry in report)


def test_broken_rollout_id_rule_is_refused_and_nothing_written(tmp_path: Path) -> None:
    rows = [sample(i, session_version="v1") for i in range(4)]
    rows[2]["rollout_id"] = 2
    write_step(tmp_path / "in", rows, step=7)
    out = tmp_path / "out"
    result = cli("build", tmp_path / "in", "--out", out, "--global-batch-size", "2")
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("rollout-shards: build: step 7: ")
    assert "step=7.parquet: rule rollout_id_only_on_v2_multi_leaf" in line
    assert line.endswith("rows (index, leaf): (2, 0)")
    assert not (out / "step=7").exists()
    assert only_refused(out, 7)
    result = cli("validate", tmp_path / "in", "--global-batch-size", "2")
    assert result.returncode == 1
    assert result.stderr.splitlines()[0].startswith("rollout-shards: validate: step 7: ")


def test_validate_reports_settings_the_data_cannot_satisfy(tmp_path: Path) -> None:
    write_step(tmp_path / "in", [sample(i) for i in range(5)])
    result = cli("validate", tmp_path / "in", "--global-batch-size", "64")
    assert result.returncode == 1
    assert "rule not_enough_samples: not enough samples 5 for global_batch_size 64" in result.stderr


def test_a_valid_step_is_written_beside_an_invalid_one(tmp_path: Path) -> None:
    write_step(tmp_path / "in", [sample(i) for i in range(4)], step=1)
    write_step(tmp_path / "in", [sample(i, status="bogus") for i in range(4)], step=2)
    result = cli("build", tmp_path / "in", "--out", tmp_path / "out", "--global-batch-size", "2")
    assert result.returncode == 1
    assert (tmp_path / "out" / "step=1" / "manifest.json").exists()
    assert not (tmp_path / "out" / "step=2").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--global-batch-size", "0"],
            "global_batch_size: Input should be greater than or equal to 1",
        ),
        (["--global-batch-size", "8", "--advantage-estimator", "bogus"], "invalid choice: 'bogus'"),
        (["--global-batch-size", "8", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--global-batch-size", "eight"], "invalid int value: 'eight'"),
        (
            [
                "--global-batch-size",
                "8",
                "--use-dynamic-global-batch-size",
                "--disable-rollout-trim-samples",
            ],
            "use_dynamic_global_batch_size needs trimming",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    result = cli("build", DATA, "--out", tmp_path / "out", *args)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert needle in line
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_missing_input_is_a_usage_error(tmp_path: Path) -> None:
    result = cli("validate", tmp_path / "nowhere", "--global-batch-size", "1")
    assert result.returncode == 2
    assert "does not exist" in result.stderr


def test_config_file_and_flags_take_precedence(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("global_batch_size: 4\ndp_size: 1\n")
    out = tmp_path / "out"
    result = cli("build", DATA, "--out", out, "--config", config, "--dp-size", "4")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "step=1" / "manifest.json").read_text())
    # data/rollouts/rollout-shards.yaml < --config < flags
    assert manifest["settings"]["global_batch_size"] == 4
    assert manifest["settings"]["dp_size"] == 4
    assert manifest["settings"]["reward_key"] == "score"


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "jsonl"])
def test_every_format_gives_the_same_shards(tmp_path: Path, fmt: str) -> None:
    rows = [sample(i, reward=float(i % 2), group_index=i // 2, loss_mask=[1, 0]) for i in range(6)]
    write_step(tmp_path / "ref", rows, fmt="parquet")
    write_step(tmp_path / fmt, rows, fmt=fmt)
    for name in ("ref", fmt):
        assert (
            cli(
                "build",
                tmp_path / name,
                "--out",
                tmp_path / f"out-{name}",
                "--global-batch-size",
                "2",
            ).returncode
            == 0
        )
    ref = digests(tmp_path / "out-ref")
    got = digests(tmp_path / f"out-{fmt}")
    assert {k: v for k, v in got.items() if "rank=" in k} == {
        k: v for k, v in ref.items() if "rank=" in k
    }


def test_step_folder_of_several_files_keeps_file_then_row_order(tmp_path: Path) -> None:
    folder = tmp_path / "in" / "step=3"
    write_step(folder, [sample(2), sample(3)], step=0)
    (folder / "step=0.parquet").rename(folder / "b.parquet")
    write_step(folder, [sample(0), sample(1)], step=0)
    (folder / "step=0.parquet").rename(folder / "a.parquet")
    shutil.copy(folder / "a.parquet", tmp_path / "unused.parquet")
    result = cli("build", tmp_path / "in", "--out", tmp_path / "out", "--global-batch-size", "4")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "step=3" / "manifest.json").read_text())
    assert [Path(i["path"]).name for i in manifest["inputs"]] == ["a.parquet", "b.parquet"]
    import polars as pl

    shard = pl.read_parquet(tmp_path / "out" / "step=3" / "rank=0.parquet")
    assert shard.get_column("sample_indices").to_list() == [0, 1, 2, 3]


def test_untrained_rows_warn_once_per_step_from_build_and_validate(tmp_path: Path) -> None:
    from tests.support.samples import sample, write_step

    write_step(tmp_path / "in", [sample(i, reward=float(i % 2)) for i in range(10)])
    flags = ["--global-batch-size", "4", "--dp-size", "2", "--disable-rollout-trim-samples"]
    for command, extra in (("build", ["--out", tmp_path / "out"]), ("validate", [])):
        run = cli(command, tmp_path / "in", *extra, *flags)
        assert run.returncode == 0, run.stderr
        warnings = [line for line in run.stderr.splitlines() if "warning" in line]
        assert warnings == [
            f"rollout-shards: {command}: step 1: warning: 2 rows on ranks [0, 1] are never "
            "trained (past each rank's last whole step of global_batch_size // dp_size rows); "
            "the rollout-side schedule (cp_size) or trimming would train them"
        ]
    assert run.stdout.splitlines()[-1].startswith("step 1: ")
    built = cli("build", tmp_path / "in", "--out", tmp_path / "again", *flags)
    assert built.stdout.splitlines()[-1] == (
        "step 1: 10 rows in, 0 quarantined, 0 trimmed, 0 dropped, 10 written to 2 ranks, "
        f"2 untrained, 2 train steps, not compact -> {tmp_path / 'again' / 'step=1'}"
    )
    manifest = json.loads((tmp_path / "out" / "step=1" / "manifest.json").read_text())
    assert manifest["counts"]["untrained"] == 2


def test_a_step_the_trainer_would_not_train_at_all_is_refused(tmp_path: Path) -> None:
    from tests.support.samples import sample, write_step

    write_step(tmp_path / "in", [sample(i, reward=float(i % 2)) for i in range(3)])
    flags = ["--global-batch-size", "8", "--dp-size", "2", "--disable-rollout-trim-samples"]
    for command, extra in (("build", ["--out", tmp_path / "out"]), ("validate", [])):
        run = cli(command, tmp_path / "in", *extra, *flags)
        assert run.returncode == 1
        assert run.stderr.startswith(
            f"rollout-shards: {command}: step 1: rule no_train_steps: the trainer would run 0 "
            "optimizer steps on this step: its 3 rows fill no rank's first step of "
            "global_batch_size=8 // dp_size=2 = 4 rows per rank"
        ), run.stderr
        assert run.stderr.count("\n") == 1
    assert not (tmp_path / "out" / "step=1").exists()


def test_warnings_go_to_stderr_with_the_prefix_and_the_summary_counts_in_singular(
    tmp_path: Path,
) -> None:
    from tests.support.samples import sample, write_step

    write_step(tmp_path / "in", [sample(i, reward=1.0) for i in range(2)])
    run = cli("build", tmp_path / "in", "--out", tmp_path / "out", "--global-batch-size", "2")
    assert run.returncode == 0, run.stderr
    assert "warning:" not in run.stdout
    assert (
        "rollout-shards: build: step 1: warning: 100% of prompt groups have zero reward std"
        in run.stderr
    )
    assert ", 2 written to 1 rank, 0 untrained, 1 train step, not compact -> " in run.stdout


def test_version() -> None:
    run = cli("--version")
    assert run.returncode == 0
    assert run.stdout.startswith("rollout-shards ")
    assert run.stdout.split()[1][0].isdigit()


def test_global_batch_size_not_divisible_by_dp_size_exits_2(tmp_path: Path) -> None:
    run = cli("validate", DATA, "--global-batch-size", "5", "--dp-size", "2")
    assert run.returncode == 2
    assert "global_batch_size=5 must be divisible by dp_size=2" in run.stderr


def test_validate_checks_rows_without_settings_and_names_what_would_check_the_rest(
    tmp_path: Path,
) -> None:
    from tests.support.samples import sample, write_step

    write_step(tmp_path / "in", [sample(i) for i in range(3)] + [sample(0)])  # a repeated row
    run = cli("validate", tmp_path / "in")
    assert run.returncode == 1
    lines = run.stderr.splitlines()
    assert lines[0].startswith("rollout-shards: note: no global_batch_size given")
    assert "give --global-batch-size" in lines[0]
    assert "rule multi_leaf_only_in_v2" in run.stderr or "rule unique_leaf" in run.stderr
    assert "Field required" not in run.stderr

    write_step(tmp_path / "ok", [sample(i) for i in range(3)])
    run = cli("validate", tmp_path / "ok")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "step 1: rows valid, 3 rows (batch not checked)"


def test_validate_of_a_step_file_finds_the_settings_of_its_root() -> None:
    run = cli("validate", DATA / "step=1.parquet")
    assert run.returncode == 0, run.stderr
    assert "note: no global_batch_size" not in run.stderr
    assert run.stdout.splitlines()[-1] == "step 1: valid, 16 rows, 16 would be written"
    folder = cli("validate", DATA / "step=3")
    assert folder.returncode == 0, folder.stderr
    assert "would be written" in folder.stdout


def test_a_missing_input_is_named_first(tmp_path: Path) -> None:
    for command in ("validate", "build"):
        extra = ["--out", str(tmp_path / "out")] if command == "build" else []
        run = cli(command, tmp_path / "nowhere", *extra)
        assert run.returncode == 2
        assert (
            run.stderr
            == f"rollout-shards: usage error: input {tmp_path / 'nowhere'} does not exist\n"
        )
