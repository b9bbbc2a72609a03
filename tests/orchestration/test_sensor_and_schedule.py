"""The sensor and the schedule, evaluated directly with their resources passed explicitly."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from pipeline.orchestration import sensors
from pipeline.orchestration.partitions import rollout_steps
from pipeline.orchestration.resources import CONFIG_ENV
from pipeline.orchestration.schedules import REASON_TAG
from tests.support.dagster_roots import EMBEDDED_KEYS, Roots, materialize
from tests.support.dagster_sensor import requested, schedule, tick


def _rewrite_step_2(roots: Roots) -> None:
    """New content for step 2: its rewards flipped."""
    path = roots.input / "step=2.arrow"
    frame = pl.read_ipc(path)
    frame.with_columns((1.0 - pl.col("reward")).alias("reward")).write_ipc(path)


def _touch(path: Path) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def test_first_tick_registers_and_requests_every_step(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    result = tick(instance)

    (request,) = result.dynamic_partitions_requests
    assert request.partitions_def_name == rollout_steps.name
    assert list(request.partition_keys) == EMBEDDED_KEYS
    assert requested(result) == EMBEDDED_KEYS
    assert all(r.run_key.startswith(f"{r.partition_key}:") for r in result.run_requests)
    assert result.cursor


def test_unchanged_steps_are_not_requested_again(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    first = tick(instance)
    _touch(roots.input / "step=1.parquet")  # new mtime, same bytes

    second = tick(instance, first.cursor)

    assert requested(second) == []
    assert not second.dynamic_partitions_requests


def test_a_changed_step_gets_a_new_run_key(instance: dg.DagsterInstance, roots: Roots) -> None:
    first = tick(instance)
    _rewrite_step_2(roots)

    second = tick(instance, first.cursor)

    assert requested(second) == ["00000002"]
    old_key = next(r.run_key for r in first.run_requests if r.partition_key == "00000002")
    assert second.run_requests[0].run_key != old_key


def test_a_new_step_is_registered_and_requested(instance: dg.DagsterInstance, roots: Roots) -> None:
    first = tick(instance)
    shutil.copy(roots.input / "step=1.parquet", roots.input / "step=12.parquet")

    second = tick(instance, first.cursor)

    (request,) = second.dynamic_partitions_requests
    assert list(request.partition_keys) == ["00000012"]
    assert requested(second) == ["00000012"]


def test_steps_with_current_shards_are_not_requested(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    assert materialize(instance, "00000001").success

    result = tick(instance)

    assert requested(result) == ["00000002", "00000003", "00000004"]


def test_changed_settings_request_every_step(
    instance: dg.DagsterInstance, roots: Roots, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tick(instance)
    settings = tmp_path / "settings.yaml"
    settings.write_text("dp_size: 4\n")
    monkeypatch.setenv(CONFIG_ENV, str(settings))

    second = tick(instance, first.cursor)

    assert requested(second) == EMBEDDED_KEYS


def test_schedule_requests_registered_steps_without_shards(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    instance.add_dynamic_partitions(rollout_steps.name, ["00000001", "00000003"])

    requests = schedule(instance)

    assert isinstance(requests, list)
    assert [r.partition_key for r in requests] == ["00000001", "00000003"]
    assert {r.tags[REASON_TAG] for r in requests} == {"missing"}


def test_schedule_skips_current_steps_and_requests_stale_ones(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    for key in ("00000001", "00000002"):
        assert materialize(instance, key).success
    assert isinstance(schedule(instance), dg.SkipReason)

    _rewrite_step_2(roots)
    requests = schedule(instance)

    assert isinstance(requests, list)
    assert [(r.partition_key, r.tags[REASON_TAG]) for r in requests] == [("00000002", "stale")]


def test_schedule_requests_steps_built_with_other_settings(
    instance: dg.DagsterInstance, roots: Roots, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert materialize(instance, "00000001").success
    settings = tmp_path / "settings.yaml"
    settings.write_text("dp_size: 4\n")
    monkeypatch.setenv(CONFIG_ENV, str(settings))

    requests = schedule(instance)

    assert isinstance(requests, list)
    assert [(r.partition_key, r.tags[REASON_TAG]) for r in requests] == [("00000001", "stale")]


def test_a_quiet_tick_hashes_nothing_and_a_big_folder_is_hashed_in_slices(
    instance: dg.DagsterInstance, roots: Roots, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[Path] = []
    real = sensors.input_digest
    monkeypatch.setattr(sensors, "input_digest", lambda path: hashed.append(path) or real(path))
    monkeypatch.setattr(sensors, "MAX_STEPS_HASHED_PER_TICK", 3)

    first = tick(instance)
    second = tick(instance, first.cursor)
    hashed.clear()
    third = tick(instance, second.cursor)

    assert requested(first) == EMBEDDED_KEYS[:3]
    assert requested(second) == EMBEDDED_KEYS[3:]
    assert requested(third) == []
    assert hashed == []
