"""Dagster with its roots in an S3-compatible store (moto's server on 127.0.0.1): the three
assets built in process and committed through `store_commit`, the shard checks reading the
stored step, a subset and a refused step each one line with nothing published, the
sensor registering the store's steps and the schedule reading the stored manifests."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from pipeline.errors import UsageError
from pipeline.io.storage import ObjectRoot
from pipeline.io.store_layout import attempt_of, manifest_key, output_key
from pipeline.orchestration import run_all
from pipeline.orchestration.compute import Compute, StepCompute
from pipeline.orchestration.resources import CONFIG_ENV, INPUT_ENV, OUTPUT_ENV, RolloutStorage
from pipeline.orchestration.sensors import rollout_steps_sensor
from tests.support.cli import cli
from tests.support.dagster_roots import (
    EMBEDDED_KEYS,
    materialize,
    materialized,
    run_checks,
    step_failure,
)
from tests.support.dagster_sensor import schedule, tick
from tests.support.s3_server import S3Server, s3_server
from tests.support.samples import REPO

ROLLOUTS = REPO / "data" / "rollouts"


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with s3_server() as running:
        yield running


@pytest.fixture
def bucket(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A bucket holding data/rollouts under `rollouts/`, configured as the input root, and
    `shards/` in it as the output root."""
    name = server.bucket()
    client = server.client()
    for path in sorted(ROLLOUTS.rglob("*")):
        if path.is_file():
            key = f"rollouts/{path.relative_to(ROLLOUTS)}"
            client.put_object(Bucket=name, Key=key, Body=path.read_bytes())
    monkeypatch.setenv(INPUT_ENV, f"s3://{name}/rollouts")
    monkeypatch.setenv(OUTPUT_ENV, f"s3://{name}/shards")
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    return name


def _checks(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_the_three_assets_and_checks_commit_the_cli_builds_bytes(
    server: S3Server, bucket: str, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    built = cli("build", f"s3://{bucket}/rollouts", "--out", local, env=server.env)
    assert built.returncode == 0, built.stderr
    result = materialize(instance, "00000003")
    assert result.success
    assert materialized(result) == ["rollout_samples", "train_batch", "training_shards"]
    checks = _checks(result)
    # the five shard checks and the rules check ran on the stored step; the two warnings
    # are as the local build's manifest says
    assert len(checks) == 6
    manifest = (local / "step=3" / "manifest.json").read_bytes()
    untrained = b'"untrained": 0' not in manifest
    for name, evaluation in checks.items():
        expected = not (name == "every_row_is_trained" and untrained)
        assert evaluation.passed is expected, (name, evaluation.description)
    # byte for byte the command line's step: its manifest, and the files it names
    assert server.body(bucket, f"shards/{manifest_key(3)}") == manifest
    attempt = attempt_of(manifest)
    names = ("rank=0.parquet", "rank=1.parquet", "report.html")
    for name in names:
        key = f"shards/{output_key(3, attempt, name)}"
        assert server.body(bucket, key) == (local / f"step=3/{name}").read_bytes()
    # the manifest lies where the trainer reads it, the files under the attempt only
    assert server.keys(bucket, "shards/") == sorted(
        [
            f"shards/{manifest_key(3)}",
            *(f"shards/{output_key(3, attempt, name)}" for name in names),
        ]
    )


def test_a_rank_file_changed_in_the_store_fails_its_check(
    server: S3Server, bucket: str, instance: dg.DagsterInstance
) -> None:
    assert materialize(instance, "00000001").success
    manifest = server.body(bucket, f"shards/{manifest_key(1)}")
    key = f"shards/{output_key(1, attempt_of(manifest), 'rank=1.parquet')}"
    frame = pl.read_parquet(io.BytesIO(server.body(bucket, key)))
    changed = io.BytesIO()
    frame.head(frame.height - 1).write_parquet(changed)
    server.client().put_object(Bucket=bucket, Key=key, Body=changed.getvalue())

    checks = _checks(run_checks(instance, "00000001"))
    assert checks["manifest_counts_add_up"].passed
    assert not checks["rank_files_match_manifest"].passed
    assert "1 rank file(s) do not match" in (checks["rank_files_match_manifest"].description or "")


def test_one_asset_alone_is_refused_in_one_line(
    server: S3Server, bucket: str, instance: dg.DagsterInstance
) -> None:
    result = materialize(instance, "00000001", selection=dg.AssetSelection.assets("train_batch"))
    step_key, failure = step_failure(result)
    assert step_key == "rollout_samples"
    assert "\n" not in failure.description
    assert re.fullmatch(
        rf"rollout-shards: usage error: step 1: train_batch alone would read or leave staged "
        rf"assets, but the output root s3://{bucket}/shards is an object store, which keeps "
        r"none: materialize the three assets of the step together",
        failure.description,
    ), failure.description
    assert materialized(result) == []
    assert server.keys(bucket, "shards/") == []


def test_a_refused_step_fails_with_its_line_and_publishes_nothing(
    server: S3Server, bucket: str, instance: dg.DagsterInstance
) -> None:
    frame = pl.read_parquet(ROLLOUTS / "step=1.parquet")
    broken = frame.with_columns(
        pl.when(pl.col("index").is_in([2, 5]))
        .then(pl.lit(999, dtype=pl.Int32))
        .otherwise(pl.col("response_length"))
        .alias("response_length")
    )
    body = io.BytesIO()
    broken.write_parquet(body)
    server.client().put_object(Bucket=bucket, Key="rollouts/step=1.parquet", Body=body.getvalue())
    result = materialize(instance, "00000001")
    assert not result.success
    step_key, failure = step_failure(result)
    assert step_key == "rollout_samples"
    first = failure.description.splitlines()[0]
    assert re.match(r"rollout-shards: build: step 1: .*response_length", first), first
    assert f"s3://{bucket}/rollouts/step=1.parquet" in failure.description
    assert "refused_record" not in failure.metadata  # an object store keeps none
    assert materialized(result) == []
    assert server.keys(bucket, "shards/") == []
    (rules,) = [e for e in result.get_asset_check_evaluations() if not e.passed]
    assert rules.check_name == "step_keeps_every_rule"


def test_the_sensor_and_the_schedule_read_the_store(
    server: S3Server, bucket: str, instance: dg.DagsterInstance
) -> None:
    first = tick(instance)
    assert [r.partition_key for r in first.run_requests or []] == EMBEDDED_KEYS
    assert sorted(instance.get_dynamic_partitions("rollout_steps")) == EMBEDDED_KEYS
    assert materialize(instance, "00000002").success
    # a tick without a cursor hashes every step: step 2's stored manifest makes it current
    again = tick(instance)
    assert [r.partition_key for r in again.run_requests or []] == [
        "00000001",
        "00000003",
        "00000004",
    ]
    requests = schedule(instance)
    assert isinstance(requests, list)
    assert [(r.partition_key, r.tags["rollout_shards/reason"]) for r in requests] == [
        ("00000001", "missing"),
        ("00000003", "missing"),
        ("00000004", "missing"),
    ]
    # step 2's rollouts rewritten after the commit: the schedule finds the step stale, and
    # the sensor's cursor (size and entity tag per object) sees the change
    cursor_tick = tick(instance)
    frame = pl.read_ipc(ROLLOUTS / "step=2.arrow")
    body = io.BytesIO()
    frame.with_columns((1.0 - pl.col("reward")).alias("reward")).write_ipc(body)
    server.client().put_object(Bucket=bucket, Key="rollouts/step=2.arrow", Body=body.getvalue())
    requests = schedule(instance)
    assert isinstance(requests, list)
    assert ("00000002", "stale") in [
        (r.partition_key, r.tags["rollout_shards/reason"]) for r in requests
    ]
    with dg.build_sensor_context(
        instance=instance,
        cursor=cursor_tick.cursor,
        resources={"rollout_storage": RolloutStorage.from_env()},
    ) as context:
        changed = rollout_steps_sensor(context)
    assert isinstance(changed, dg.SensorResult)
    assert [r.partition_key for r in changed.run_requests or []] == ["00000002"]


def test_a_pipes_worker_commits_the_same_step(
    server: S3Server, bucket: str, instance: dg.DagsterInstance
) -> None:
    """The subprocess worker gets the roots as URLs and commits as the run's process does."""
    in_process = materialize(instance, "00000004")
    assert in_process.success
    stored = {key: server.body(bucket, key) for key in server.keys(bucket, "shards/")}
    server.client().delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": key} for key in stored]}
    )
    result = materialize(instance, "00000004", compute=StepCompute(compute=Compute.subprocess))
    assert result.success
    assert materialized(result) == ["rollout_samples", "train_batch", "training_shards"]
    assert {key: server.body(bucket, key) for key in server.keys(bucket, "shards/")} == stored


def test_make_run_with_a_store_root_is_one_usage_line(
    bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_all.main() == 2
    err = capsys.readouterr().err
    assert err == (
        f"rollout-shards: usage error: make run builds local roots only, not s3://{bucket}/"
        "rollouts: use `rollout-shards build` or the Dagster sensor and jobs (docs/deploy.md)\n"
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("../elsewhere", "is not a prefix inside the configured root"),
        ("s3://other/shards", "is not a prefix inside the configured root"),
        ("s3://b/shards2", "is not a prefix inside the configured root"),
        ("dp4/step=3", "lies inside the step prefix step=3"),
    ],
)
def test_run_configs_prefix_stays_inside_the_store_root(
    value: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OUTPUT_ENV, "s3://b/shards")
    assert RolloutStorage(output_root="dp4").output_path == ObjectRoot("s3://b/shards/dp4")
    assert RolloutStorage(output_root="s3://b/shards/dp4/").output_path == ObjectRoot(
        "s3://b/shards/dp4"
    )
    with pytest.raises(UsageError, match=re.escape(f"output_root {value} {problem}")):
        RolloutStorage(output_root=value).output_path  # noqa: B018 - the property checks
