"""Materializing partitions in process: files written, checks run, metadata shown, failures."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.loader import LoadingContextForTest

from pipeline import cli
from pipeline import columns as c
from pipeline.io import writer
from pipeline.orchestration import stage_reports as stages
from pipeline.orchestration.partitions import rollout_steps, step_of
from pipeline.orchestration.reporting import FAILURE_TAG, STEP_KEEPS_EVERY_RULE
from pipeline.step.readers import spill
from tests.support.dagster_roots import (
    CHECK_KEYS,
    EMBEDDED_KEYS,
    Roots,
    break_step_1,
    failed_at_the_batch,
    materialize,
    materialized,
    metadata_of,
    run_checks,
    step_failure,
    written_step,
)
from tests.support.samples import dead_pid, only_refused

BLOCKING_CHECKS = {
    STEP_KEEPS_EVERY_RULE,
    "manifest_counts_add_up",
    "rank_files_match_manifest",
    "rollouts_stay_in_one_train_step",
}


def _metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, object]:
    return {key: value.value for key, value in metadata_of(result, asset).items()}


def _named(table: dg.TableMetadataValue, column: str) -> dict[str, object]:
    """A name-per-line metadata table as a dict."""
    return {record.data["name"]: record.data[column] for record in table.records}


def _checks(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_valid_partition_writes_the_step_folder(instance: dg.DagsterInstance, roots: Roots) -> None:
    result = materialize(instance, "00000001")

    assert result.success
    manifest = written_step(roots, 1)
    assert manifest["counts"]["written"] == 16
    # The three assets ran in one session: the batch was handed on in memory, not staged.
    assert not (roots.output / ".staging").exists()


def _one_asset(instance: dg.DagsterInstance, key: str, asset: str) -> dg.ExecuteInProcessResult:
    return materialize(instance, key, selection=dg.AssetSelection.assets(asset))


def test_assets_run_on_their_own_go_through_staging(
    instance: dg.DagsterInstance, roots: Roots, tmp_path: Path
) -> None:
    staged = roots.output / ".staging"
    assert _one_asset(instance, "00000004", "rollout_samples").success
    assert (staged / "rollout_samples" / "step=4" / "samples.parquet").is_file()
    assert not (staged / "train_batch").exists()
    batch = _one_asset(instance, "00000004", "train_batch")
    assert batch.success
    assert _metadata(batch, "train_batch")["staged"] == str(staged / "train_batch" / "step=4")
    shards = _one_asset(instance, "00000004", "training_shards")
    assert shards.success
    assert [e.asset_key.to_user_string() for e in shards.get_asset_materialization_events()] == [
        "training_shards"
    ]

    cli_out = tmp_path / "cli"
    assert cli.main(["build", str(roots.input), "--out", str(cli_out)]) == 0
    for rank_file in sorted((cli_out / "step=4").glob("rank=*.parquet")):
        assert (roots.output / "step=4" / rank_file.name).read_bytes() == rank_file.read_bytes()


def test_a_whole_step_run_removes_the_staged_copies_it_supersedes(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    assert _one_asset(instance, "00000004", "rollout_samples").success
    assert materialize(instance, "00000004").success

    assert not (roots.output / ".staging" / "rollout_samples" / "step=4").exists()
    lone = _one_asset(instance, "00000004", "train_batch")
    assert not lone.success
    _, failure = step_failure(lone)
    assert "no staged rollout_samples" in failure.description
    assert "materialize rollout_samples first" in failure.description


def test_a_full_disk_while_staging_is_one_line(
    instance: dg.DagsterInstance, roots: Roots, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polars' write to a full disk (/dev/full, a real ENOSPC) fails the step with the
    command line's one line, not a traceback, and stages nothing."""
    write = pl.DataFrame.write_parquet
    monkeypatch.setattr(
        pl.DataFrame, "write_parquet", lambda frame, _, **kw: write(frame, "/dev/full", **kw)
    )

    result = _one_asset(instance, "00000004", "rollout_samples")

    assert not result.success
    _, failure = step_failure(result)
    line = failure.description
    assert line.startswith(
        "rollout-shards: build: step 4: rule os_error: no space left on "
        f"{roots.output / '.staging'}"
    )
    assert line.endswith("/samples.parquet") and "\n" not in line
    assert not (roots.output / ".staging" / "rollout_samples" / "step=4").exists()


def test_a_killed_stage_leaves_nothing_the_next_run_keeps(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    dead = dead_pid()
    host = writer._host()
    leftovers = {
        asset: roots.output / ".staging" / asset / f".tmp-step=1-{host}-{dead}-0123abcd"
        for asset in ("rollout_samples", "train_batch")
    }
    live = roots.output / ".staging" / "train_batch" / f".tmp-step=2-{host}-{os.getpid()}-4567cdef"
    for folder in [*leftovers.values(), live]:
        folder.mkdir(parents=True)
        (folder / "samples.parquet").write_bytes(b"partial")

    # Staging happens when the assets run one by one.
    for asset in ("rollout_samples", "train_batch"):
        assert _one_asset(instance, "00000001", asset).success

    for asset, leftover in leftovers.items():
        assert sorted(p.name for p in leftover.parent.iterdir() if p.name != ".locks") == sorted(
            ["step=1", *([live.name] if asset == "train_batch" else [])]
        )


def test_valid_partition_passes_every_check(instance: dg.DagsterInstance, roots: Roots) -> None:
    result = materialize(instance, "00000003")

    checks = _checks(result)
    assert set(checks) == BLOCKING_CHECKS | {"no_rows_quarantined", "every_row_is_trained"}
    assert all(check.passed for check in checks.values())
    assert all(check.partition == "00000003" for check in checks.values())
    assert {name for name, check in checks.items() if check.blocking} == BLOCKING_CHECKS


def test_materialization_metadata(instance: dg.DagsterInstance, roots: Roots) -> None:
    result = materialize(instance, "00000004")

    shards = _metadata(result, "training_shards")
    manifest = json.loads((roots.output / "step=4" / "manifest.json").read_text())
    assert shards["dagster/partition_row_count"] == manifest["counts"]["written"] == 8
    # counts and layout as one-row tables: in view, and not charted before the metrics
    assert _named(shards["rows"], "rows") == manifest["counts"]
    assert _named(shards["layout"], "value") == {
        "is_compact": False,
        "global_batch_size": 8,
        "dynamic_global_batch_size": None,
        "num_train_steps": 1,
    }
    charted = [key for key, value in shards.items() if isinstance(value, int | float)]
    assert set(charted) - {"dagster/partition_row_count"} == {
        stages.metric_key(name) for name in manifest["stats"]
    }
    columns = shards["dagster/column_schema"].columns
    assert [column.name for column in columns] == list(c.DATASET_COLUMNS)
    assert {column.name: column.description for column in columns} == c.DATASET_DESCRIPTIONS
    assert all(column.description for column in columns)
    ranks = [record.data for record in shards["ranks"].records]
    assert ranks == [
        {"file": o["path"], "rows": o["rows"], "tokens": o["tokens"]}
        for o in manifest["outputs"]
        if o["path"].startswith("rank=")
    ]
    # the step's report: a link to it, and its figures inline
    assert shards["report"] == (roots.output / "step=4" / "report.html").absolute().as_uri()
    assert str(shards["report_figures"]).count("](data:image/svg+xml;base64,") == 3
    # every rollout metric of the manifest, as float metadata (the Plots tab charts them),
    # under its name without `rollout/`, first
    assert manifest["stats"]["rollout/response_len/mean"] > 0
    assert shards["response_len/mean"] == manifest["stats"]["rollout/response_len/mean"]
    for name, value in manifest["stats"].items():
        key = stages.metric_key(name)
        assert isinstance(shards[key], float) and shards[key] == value, name
    assert "reward_mean" not in shards
    assert list(shards)[: len(manifest["stats"])] == [
        stages.metric_key(name) for name in manifest["stats"]
    ]
    assert shards["present_columns"] == manifest["present_columns"]
    assert shards["path"] == str(roots.output / "step=4")

    samples = _metadata(result, "rollout_samples")
    assert samples["dagster/partition_row_count"] == samples["ingested"] == 13
    described = {col.name: col.description for col in samples["dagster/column_schema"].columns}
    assert described[c.RESPONSE_LENGTH] == stages.INPUT_DESCRIPTIONS[c.RESPONSE_LENGTH] != ""
    assert {name for name, text in described.items() if not text} == set()
    batch = _metadata(result, "train_batch")
    assert batch["dagster/partition_row_count"] == 8
    assert _named(batch["rows"], "rows")["trimmed"] == 5


def test_dagster_shards_are_byte_identical_to_the_cli(
    instance: dg.DagsterInstance, roots: Roots, tmp_path: Path
) -> None:
    for key in EMBEDDED_KEYS:
        assert materialize(instance, key).success
    cli_out = tmp_path / "cli"
    assert cli.main(["build", str(roots.input), "--out", str(cli_out)]) == 0

    for step in (1, 2, 3, 4):
        names = sorted(p.name for p in (cli_out / f"step={step}").glob("*.parquet"))
        assert names == sorted(p.name for p in (roots.output / f"step={step}").glob("*.parquet"))
        for name in names:
            dagster_bytes = (roots.output / f"step={step}" / name).read_bytes()
            assert dagster_bytes == (cli_out / f"step={step}" / name).read_bytes()


def test_a_step_above_the_spill_threshold_is_built_rank_by_rank_alike(
    instance: dg.DagsterInstance, roots: Roots, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole-step run takes a step above the `stream_above` setting (run config, as the
    CLI's flag) through the rank-bounded build, with the same shards and the loaded columns
    (lists included) in the UI."""
    ran: list[int] = []
    spilled = spill.spilled
    monkeypatch.setattr(
        spill, "spilled", lambda batch, spill: ran.append(1) or spilled(batch, spill)
    )
    run_config = {"ops": {"rollout_samples": {"config": {"stream_above": 0}}}}
    result = materialize(instance, "00000001", run_config)
    assert result.success and ran == [1]
    cli_out = tmp_path / "cli"
    assert cli.main(["build", str(roots.input), "--out", str(cli_out)]) == 0
    names = sorted(p.name for p in (cli_out / "step=1").iterdir())
    assert names == sorted(p.name for p in (roots.output / "step=1").iterdir())
    for name in names:
        assert (roots.output / "step=1" / name).read_bytes() == (
            cli_out / "step=1" / name
        ).read_bytes()
    schema = _metadata(result, "rollout_samples")["dagster/column_schema"]
    columns = {column.name: column.type for column in schema.columns}
    assert columns["tokens"] == "List(Int32)" and "_n_tokens" not in columns
    assert not [p for p in roots.output.iterdir() if p.name.startswith(".tmp-")]


def test_invalid_partition_fails_at_rollout_samples_and_writes_nothing(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    break_step_1(roots)

    result = materialize(instance, "00000001")

    assert not result.success
    step_key, failure = step_failure(result)
    assert step_key == "rollout_samples"
    assert "rule response_within_tokens" in failure.description
    per_rule = failure.metadata["invalid_rows_per_rule"].value
    assert per_rule["response_within_tokens"] == 2
    rows = failure.metadata["first_offending_rows"].value
    assert rows.splitlines()[0] == "| rule | file | index | leaf |"
    assert f"| response_within_tokens | {roots.input / 'step=1.parquet'} | 2 | 0 |" in rows
    assert "response_within_tokens" in instance.get_run_by_id(result.run_id).tags[FAILURE_TAG]
    assert materialized(result) == []
    # nothing but the refusal's record, which the failure points to
    assert only_refused(roots.output, 1)
    record = str(roots.output / "_refused" / "step=1.json")
    assert failure.metadata["refused_record"].value == record


def test_a_refused_step_fails_its_rule_check_with_the_lines(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    """Where the partition's red dot leads: the failed `step_keeps_every_rule` check on the
    partition (red, not an observation), with the line the command line prints (rule,
    file, first rows) and the offending rows as metadata; a published step passes it."""
    break_step_1(roots)
    result = materialize(instance, "00000001")
    assert not result.success
    assert instance.fetch_observations(dg.AssetKey("rollout_samples"), limit=5).records == []
    (evaluation,) = _checks(result).values()
    assert evaluation.check_name == STEP_KEEPS_EVERY_RULE
    assert evaluation.asset_key == dg.AssetKey("rollout_samples")
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert evaluation.partition == "00000001"
    assert evaluation.description is not None
    assert evaluation.description.startswith("rollout-shards: build: step 1: ")
    assert "rule response_within_tokens" in evaluation.description
    metadata = evaluation.metadata
    assert "rule response_within_tokens" in metadata["refused"].value
    assert metadata["files"].value == [str(roots.input / "step=1.parquet")]
    assert f"| response_within_tokens | {roots.input / 'step=1.parquet'} | 2 | 0 |" in (
        metadata["first_offending_rows"].value
    )
    # the run's failure puts the cause first: the same lines, no exception's name
    _, failure = step_failure(result)
    assert failure.description == evaluation.description
    built = materialize(instance, "00000002")
    (passed,) = [e for e in _checks(built).values() if e.check_name == STEP_KEEPS_EVERY_RULE]
    assert passed.passed and passed.partition == "00000002"


SHARD_CHECK_KEYS = [key for key in CHECK_KEYS if key.name != STEP_KEEPS_EVERY_RULE]


def _check_records(instance: dg.DagsterInstance) -> dict[str, list[tuple[str, str, str]]]:
    """Every check's executions on record: (partition, run, resolved status), newest first."""
    loading = LoadingContextForTest(instance)
    records: dict[str, list[tuple[str, str, str]]] = {}
    for key in SHARD_CHECK_KEYS:
        history = instance.event_log_storage.get_asset_check_execution_history(key, limit=10)
        records[key.name] = [
            (r.partition, r.run_id, asyncio.run(r.resolve_status(loading)).value) for r in history
        ]
    return records


def test_a_refused_runs_log_puts_its_cause_first(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    """The run's log of a refused step, as the UI lists it: no "Not executing" row per
    check (the checks are the step's own, not steps of their own), and the one step
    failure whose error opens with the command line's lines, no chained traceback below."""
    break_step_1(roots)
    result = materialize(instance, "00000001")
    records = instance.all_logs(result.run_id)
    errors = [r for r in records if r.level >= logging.ERROR]
    assert [r.dagster_event.event_type for r in errors if r.dagster_event] == [
        dg.DagsterEventType.STEP_FAILURE,
        dg.DagsterEventType.RUN_FAILURE,
    ]
    assert not [r for r in records if "Not executing" in (r.user_message or "")]
    (failure,) = [r.dagster_event for r in errors if r.dagster_event.is_step_failure]
    error = failure.step_failure_data.error
    cause = "rollout-shards: build: step 1: "
    assert error.message.startswith(f"dagster._core.definitions.events.Failure: {cause}")
    assert error.cause is None and error.context is None
    assert failure.step_failure_data.user_failure_data.description.startswith(cause)


def test_execute_checks_alone_reads_the_published_step(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    """ "Execute checks" without the assets: the shard checks read the committed step, and
    `step_keeps_every_rule` says what the root says (published, refused or not built)."""
    assert materialize(instance, "00000002").success
    rerun = run_checks(instance, "00000002")
    assert rerun.success
    evaluations = {e.check_name: e for e in rerun.get_asset_check_evaluations()}
    assert set(evaluations) == {key.name for key in CHECK_KEYS}
    assert all(e.passed for e in evaluations.values())
    assert materialized(rerun) == []
    instance.add_dynamic_partitions(rollout_steps.name, ["00000003"])
    unbuilt = run_checks(instance, "00000003")
    assert not unbuilt.success
    kept = {e.check_name: e for e in unbuilt.get_asset_check_evaluations()}[STEP_KEEPS_EVERY_RULE]
    assert not kept.passed and "step 3 is not built" in (kept.description or "")
    break_step_1(roots)
    assert not materialize(instance, "00000001").success
    refused = run_checks(instance, "00000001")
    kept = {e.check_name: e for e in refused.get_asset_check_evaluations()}[STEP_KEEPS_EVERY_RULE]
    assert not kept.passed
    assert "rule response_within_tokens" in (kept.description or "")


def test_a_refused_step_fails_its_run_and_partition_not_the_checks(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    """Dagster plans every check with the run; a planned check of a failed run would read
    "execution failed". The refused step leaves no check execution: its run and its
    partition carry the failure, and the checks say only what they checked."""
    break_step_1(roots)
    refused = materialize(instance, "00000001")
    built = materialize(instance, "00000002")

    assert (refused.success, built.success) == (False, True)
    assert instance.get_run_by_id(refused.run_id).status == dg.DagsterRunStatus.FAILURE
    assert _check_records(instance) == {
        name: [("00000002", built.run_id, "SUCCEEDED")]
        for name in (
            *BLOCKING_CHECKS - {STEP_KEEPS_EVERY_RULE},
            "every_row_is_trained",
            "no_rows_quarantined",
        )
    }
    with partition_loading_context(dynamic_partitions_store=instance):
        for key in SHARD_CHECK_KEYS:
            state = instance.event_log_storage.get_asset_check_state([(key, rollout_steps)])[key]
            statuses = {
                status.value: sorted(subset.subset_value.get_partition_keys())
                for status, subset in state.subsets.items()
                if not subset.is_empty
            }
            assert statuses == {"SUCCEEDED": ["00000002"]}, key.name
    # The partition is failed, not missing: the run that planned it failed.
    failed = instance.get_run_records(
        dg.RunsFilter(
            tags={"dagster/partition": "00000001"}, statuses=[dg.DagsterRunStatus.FAILURE]
        )
    )
    assert [r.dagster_run.run_id for r in failed] == [refused.run_id]


def test_settings_the_data_cannot_satisfy_fail_before_writing(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    run_config = {"ops": {"rollout_samples": {"config": {"global_batch_size": 64}}}}

    result = materialize(instance, "00000002", run_config)

    assert not result.success
    failed_at_the_batch(result, roots, 2)


def test_run_config_settings_override_the_settings_files(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    run_config = {
        "ops": {"rollout_samples": {"config": {"dp_size": 4, "advantage_estimator": "ppo"}}}
    }

    assert materialize(instance, "00000001", run_config).success

    folder = roots.output / "step=1"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["settings"]["dp_size"] == 4
    assert manifest["settings"]["advantage_estimator"] == "ppo"
    assert manifest["settings"]["reward_key"] == "score"  # from the input root's yaml
    assert sorted(p.name for p in folder.glob("rank=*")) == [f"rank={r}.parquet" for r in range(4)]


def test_quarantine_succeeds_with_a_warning_check(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    break_step_1(roots)
    run_config = {"ops": {"rollout_samples": {"config": {"on_invalid": "quarantine"}}}}

    result = materialize(instance, "00000001", run_config)

    assert result.success
    assert (roots.output / "_quarantine" / "step=1.parquet").is_file()
    assert not (roots.output / "step=1" / "quarantine.parquet").exists()
    checks = _checks(result)
    warning = checks["no_rows_quarantined"]
    assert not warning.passed
    assert warning.severity == dg.AssetCheckSeverity.WARN
    # the two broken rows and the rest of their prompt groups (SEMANTICS 5.4)
    assert warning.metadata["quarantined"].value == 8
    assert "response_within_tokens" in warning.metadata["reasons"].value
    assert "reward_group_kept_whole" in warning.metadata["reasons"].value
    assert all(checks[name].passed for name in BLOCKING_CHECKS)


def test_untrained_rows_succeed_with_a_warning_check(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    # 16 rows on 2 ranks of 8, 6 // 2 = 3 rows per step: 2 steps, 2 untrained rows a rank
    settings = {"global_batch_size": 6, "dp_size": 2, "disable_rollout_trim_samples": True}
    run_config = {"ops": {"rollout_samples": {"config": settings}}}

    result = materialize(instance, "00000001", run_config)

    assert result.success
    checks = _checks(result)
    warning = checks["every_row_is_trained"]
    assert not warning.passed
    assert warning.severity == dg.AssetCheckSeverity.WARN
    assert warning.metadata["untrained"].value == 4
    assert warning.description.startswith("4 rows on ranks [0, 1] are never trained")
    assert all(checks[name].passed for name in BLOCKING_CHECKS)


def test_checks_catch_a_tampered_rank_file(instance: dg.DagsterInstance, roots: Roots) -> None:
    assert materialize(instance, "00000001").success
    rank = roots.output / "step=1" / "rank=0.parquet"
    pl.read_parquet(rank).head(3).write_parquet(rank)
    (roots.output / "step=1" / "rank=1.parquet").unlink()

    result = run_checks(instance, "00000001")

    checks = _checks(result)
    assert not checks["rank_files_match_manifest"].passed
    problems = checks["rank_files_match_manifest"].metadata["problems"].value
    assert "| rank=0.parquet | sha256 differs from the manifest |" in problems
    assert "| rank=1.parquet | missing |" in problems
    assert not checks["rollouts_stay_in_one_train_step"].passed
    assert checks["manifest_counts_add_up"].passed  # the manifest itself still adds up


@pytest.mark.parametrize(
    ("resource_config", "message"),
    [
        ({"output_root": "/tmp/elsewhere"}, "outside the configured root"),
        ({"output_root": "../escape"}, "outside the configured root"),
        ({"input_root": "/etc"}, "outside the configured root"),
        ({"config": "/etc/hostname"}, "outside the configured root"),
    ],
)
def test_run_config_paths_outside_the_roots_are_refused(
    instance: dg.DagsterInstance, roots: Roots, resource_config: dict[str, str], message: str
) -> None:
    run_config = {"resources": {"rollout_storage": {"config": resource_config}}}

    result = materialize(instance, "00000001", run_config)

    assert not result.success
    _, failure = step_failure(result)
    assert message in failure.description
    assert not roots.output.exists()
    assert not (roots.output.parent / "escape").exists()


def test_a_symlink_out_of_the_output_root_is_refused(
    instance: dg.DagsterInstance, roots: Roots, tmp_path: Path
) -> None:
    roots.output.mkdir()
    (roots.output / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    run_config = {"resources": {"rollout_storage": {"config": {"output_root": "link"}}}}

    result = materialize(instance, "00000001", run_config)

    assert not result.success
    assert not (tmp_path / "outside").exists()


def test_run_config_may_narrow_the_output_root(instance: dg.DagsterInstance, roots: Roots) -> None:
    run_config = {"resources": {"rollout_storage": {"config": {"output_root": "dp4"}}}}

    assert materialize(instance, "00000001", run_config).success

    assert (roots.output / "dp4" / "step=1" / "manifest.json").is_file()
    assert not (roots.output / "step=1").exists()


def test_an_output_root_inside_a_committed_step_folder_is_refused(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    assert materialize(instance, "00000001").success
    before = sorted(p.name for p in (roots.output / "step=1").iterdir())
    run_config = {"resources": {"rollout_storage": {"config": {"output_root": "step=1/nested"}}}}

    result = materialize(instance, "00000001", run_config)

    assert not result.success
    _, failure = step_failure(result)
    assert "inside the committed step folder" in failure.description
    assert sorted(p.name for p in (roots.output / "step=1").iterdir()) == before


@pytest.mark.parametrize("key", ["abc", "2", "1_0", "0000001 ", "０００００００１"])
def test_a_partition_key_that_is_not_8_digits_is_a_failure(key: str) -> None:
    with pytest.raises(dg.Failure, match="is not a rollout step"):
        step_of(key)


def test_an_8_digit_partition_key_is_its_step() -> None:
    assert step_of("00000010") == 10


def _split_a_rollout(roots: Roots) -> int:
    """Give the first row of rank 0 the rollout id of a row in train step 1."""
    rank = roots.output / "step=1" / "rank=0.parquet"
    frame = pl.read_parquet(rank)
    later = frame.filter(pl.col(c.TRAIN_STEP) == 1).get_column(c.ROLLOUT_IDS)[0]
    first = pl.int_range(pl.len()) == 0
    frame.with_columns(
        pl.when(first).then(pl.lit(later)).otherwise(pl.col(c.ROLLOUT_IDS)).alias(c.ROLLOUT_IDS)
    ).write_parquet(rank)
    return later


def test_a_rollout_split_across_train_steps_is_counted_without_the_schedule(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    assert materialize(instance, "00000001").success  # two train steps
    later = _split_a_rollout(roots)

    split = _checks(run_checks(instance, "00000001"))["rollouts_stay_in_one_train_step"]
    assert split.passed  # the trainer splits rollouts across steps too (SEMANTICS 6.1)
    assert split.metadata["split_rollouts"].value == 1
    assert split.metadata["scheduled"].value is False
    assert f"| rollout {later} | in train steps [0, 1] |" in (
        split.metadata["first_split_rollouts"].value
    )


def test_a_rollout_split_across_train_steps_fails_the_check_with_the_schedule(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    settings = {"cp_size": 1, "micro_batch_size": 1, "global_batch_size": 4}
    run_config = {"ops": {"rollout_samples": {"config": settings}}}
    assert materialize(instance, "00000001", run_config).success
    _split_a_rollout(roots)

    split = _checks(run_checks(instance, "00000001"))["rollouts_stay_in_one_train_step"]
    assert not split.passed
    assert split.metadata["split_rollouts"].value == 1
