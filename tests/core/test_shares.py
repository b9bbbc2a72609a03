"""A step read and written by tasks (`pipeline.step.readers.shares`), here in this process
(`LocalTasks`): the bytes of the in-memory build for every layout and kind of input, the
in-memory build's exact report and quarantine for a bad step, and a driver that never holds
a per-token list. tests/orchestration/test_ray_ranks.py runs the same tasks on Ray."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

from pipeline import columns as c
from pipeline.errors import StepError
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step.build import StepJob, build_step
from pipeline.step.check import check
from pipeline.step.readers import shares
from tests.support import layouts
from tests.support.samples import TRAINERS, generated_step


class CountingTasks(shares.LocalTasks):
    """Local tasks that count what each kind of task was asked."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def run(self, calls: Any) -> list[Any]:
        self.calls += [function.__name__ for function, _ in calls]
        return super().run(calls)

    def scatter(self, calls: Any) -> list[list[Any]]:
        self.calls += [function.__name__ for (function, _), _ in calls]
        return super().scatter(calls)


@pytest.fixture
def small_shares(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Shares of a few row groups: a file of several row groups is read by several tasks."""
    monkeypatch.setattr(shares, "SHARE_BYTES", 256 << 10)
    yield


def _route(tasks: shares.Tasks) -> Callable[[StepJob], StepJob]:
    return lambda job: shares.by_tasks(job, tasks)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".locks" not in path.parts
    }


def build_both(
    folder: Path, out: Path, settings: Settings, tasks: shares.Tasks | None = None
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Every file of every step built in memory and by tasks, by name."""
    steps = group_steps(find_sources([folder]))
    for step, files in steps.items():
        build_step(step, files, settings.replace(stream_above=None), out / "memory")
        route = _route(tasks or shares.LocalTasks())
        build_step(step, files, settings, out / "tasks", route=route)
    return _files(out / "memory"), _files(out / "tasks")


def _row_groups(folder: Path) -> Path:
    table = pq.read_table(generated_step(folder / "gen") / "step=0.parquet")
    (folder / "rollouts").mkdir(parents=True)
    pq.write_table(table, folder / "rollouts" / "step=0.parquet", row_group_size=400)
    return folder / "rollouts"


INPUTS: dict[str, Callable[[Path], Path]] = {
    "one file of row groups": _row_groups,
    layouts.THREE_FILES: layouts.three_files_one_without_loss_mask,
    "parquet, ipc and json lines": lambda folder: layouts.mixed_files(
        folder, ("parquet", "ipc", "ndjson")
    ),
    "files named without a step": lambda folder: layouts.step_column_files(folder, 700),
}
SETTINGS = {
    **layouts.LAYOUTS,
    # the shuffle splits each share among many ranks: the same step at dp 8 and dp 32
    "dp 8 balanced": {"global_batch_size": 256, "dp_size": 8, "balance_data": True},
    "dp 32": {"global_batch_size": 256, "dp_size": 32},
}
CASES = layouts.cases("one file of row groups", list(INPUTS), list(SETTINGS))


@pytest.mark.parametrize(("inputs", "settings"), CASES)
def test_same_bytes_as_in_memory(
    inputs: str, settings: str, tmp_path: Path, small_shares: None
) -> None:
    folder = INPUTS[inputs](tmp_path / "in")
    tasks = CountingTasks()
    memory, by_tasks = build_both(folder, tmp_path / "out", Settings(**SETTINGS[settings]), tasks)
    assert sorted(memory) == sorted(by_tasks)
    assert [name for name in memory if memory[name] != by_tasks[name]] == []
    assert any(name.endswith("rank=1.parquet") for name in memory)
    # the write decodes each share's lists once (a split per share), not once per rank
    assert tasks.calls.count("read_share") > 1
    assert tasks.calls.count("split_share") <= tasks.calls.count("read_share")
    rank_files = [name for name in by_tasks if "/rank=" in name]
    assert tasks.calls.count("write_rank_pieces") == len(rank_files)
    assert "share_lists" not in tasks.calls


def test_non_compact_step_is_trimmed_alike(tmp_path: Path) -> None:
    folder = generated_step(tmp_path / "in", non_compact=True)
    memory, by_tasks = build_both(folder, tmp_path / "out", Settings(global_batch_size=64))
    assert memory == by_tasks
    assert json.loads(memory["step=0/manifest.json"])["counts"]["trimmed"] > 0
    assert json.loads(memory["step=0/manifest.json"])["is_compact"] is False


@pytest.mark.parametrize("trainer", TRAINERS)
def test_every_trainer_profile_alike(trainer: str, tmp_path: Path, small_shares: None) -> None:
    folder = generated_step(tmp_path / "in", non_compact=True)
    settings = Settings(**TRAINERS[trainer])
    memory, by_tasks = build_both(folder, tmp_path / "out", settings)
    assert memory == by_tasks
    assert json.loads(memory["step=0/manifest.json"])["settings"]["trainer"] == trainer


def _changed_step(tmp_path: Path, column: str, value: pl.Expr) -> Path:
    table = pq.read_table(generated_step(tmp_path / "gen") / "step=0.parquet")
    folder = tmp_path / "in"
    folder.mkdir()
    changed = pl.from_arrow(table).with_columns(value.alias(column))  # type: ignore[union-attr]
    pq.write_table(changed.to_arrow(), folder / "step=0.parquet", row_group_size=500)
    return folder


def test_repaired_ids_alike(tmp_path: Path, small_shares: None) -> None:
    legacy = pl.when(pl.col("session_version") == "v1").then(pl.col("index"))
    folder = _changed_step(tmp_path, "rollout_id", legacy.otherwise(pl.col("rollout_id")))
    settings = Settings(global_batch_size=64, dp_size=4, rollout_id_policy="repair")
    memory, by_tasks = build_both(folder, tmp_path / "out", settings)
    assert memory == by_tasks
    assert json.loads(memory["step=0/manifest.json"])["counts"]["repaired"] > 0


BREAKS = {
    "a row rule": pl.col("response_length") + 100_000,  # longer than its tokens
    "a column test": pl.lit(-1, dtype=pl.Int32),  # response_length >= 0
    "a null list": None,  # tokens must not be null: a list's own test, found by its shape
}


def _broken(tmp_path: Path, rule: str) -> Path:
    at = pl.int_range(pl.len()).is_in([100, 2500])
    if BREAKS[rule] is None:
        return _changed_step(tmp_path, "tokens", pl.when(~at).then(pl.col("tokens")))
    value = pl.when(at).then(BREAKS[rule]).otherwise(pl.col("response_length"))
    return _changed_step(tmp_path, "response_length", value)


@pytest.mark.parametrize("rule", BREAKS)
def test_quarantined_trajectories_as_in_memory(
    rule: str, tmp_path: Path, small_shares: None
) -> None:
    """The same rank files, quarantine table (lists read back from the files) and manifest."""
    folder = _broken(tmp_path, rule)
    settings = Settings(global_batch_size=64, dp_size=4, on_invalid="quarantine")
    tasks = CountingTasks()
    memory, by_tasks = build_both(folder, tmp_path / "out", settings, tasks)
    assert sorted(memory) == sorted(by_tasks)
    assert [name for name in memory if memory[name] != by_tasks[name]] == []
    assert "_quarantine/step=0.parquet" in memory
    assert "share_lists" in tasks.calls


def _refusal(folder: Path, root: Path, settings: Settings, tasks: bool) -> str:
    (step, files), *_ = group_steps(find_sources([folder])).items()
    route = _route(shares.LocalTasks()) if tasks else None
    with pytest.raises(StepError) as caught:
        build_step(step, files, settings.replace(stream_above=None), root, route=route)
    return str(caught.value)


@pytest.mark.parametrize("rule", BREAKS)
def test_a_broken_rule_fails_as_in_memory(rule: str, tmp_path: Path, small_shares: None) -> None:
    folder = _broken(tmp_path, rule)
    settings = Settings(global_batch_size=64, dp_size=4)
    memory = _refusal(folder, tmp_path / "memory", settings, False)
    by_tasks = _refusal(folder, tmp_path / "tasks", settings, True)
    assert by_tasks == memory
    assert not (tmp_path / "tasks" / "step=0").exists()


def test_values_of_another_type_in_later_shares_are_reported_as_in_memory(
    tmp_path: Path, small_shares: None
) -> None:
    """Type violations found by several tasks (loss_mask values 0.5 in two shares) are
    merged into the whole read's line, and quarantined as in memory."""
    floats = pl.col("loss_mask").cast(pl.List(pl.Float64))
    odd = pl.int_range(pl.len()).is_in([1200, 2995])
    halves = floats.list.eval(pl.element() + 0.5)
    folder = _changed_step(tmp_path, "loss_mask", pl.when(odd).then(halves).otherwise(floats))
    settings = Settings(global_batch_size=64, dp_size=4)
    memory = _refusal(folder, tmp_path / "memory", settings, False)
    assert _refusal(folder, tmp_path / "tasks", settings, True) == memory
    assert "column_type" in memory
    quarantining = settings.replace(on_invalid="quarantine")
    memory_files, task_files = build_both(folder, tmp_path / "out", quarantining)
    assert memory_files == task_files
    assert "_quarantine/step=0.parquet" in memory_files


def test_the_driver_holds_no_list(tmp_path: Path, small_shares: None) -> None:
    """What the read hands the plan carries no list column, and each rank's writer is given
    its own rows, not their lists."""
    folder = _row_groups(tmp_path / "in")
    (step, files), *_ = group_steps(find_sources([folder])).items()
    job = StepJob(step, files, Settings(global_batch_size=64, dp_size=4), tmp_path / "out")
    reader = shares.SharesReader(shares.LocalTasks())
    samples = check(reader.read(job), job.settings)
    assert not set(c.PER_TOKEN_COLUMNS) & set(samples.frame.columns)
    assert set(c.PER_TOKEN_COLUMNS) & set(samples.schema)  # the step's columns as loaded
    from pipeline.step.plan import plan_batch

    batch = reader.planned(plan_batch(samples, job.settings))  # type: ignore[arg-type]
    rows = batch.rank_rows
    assert isinstance(rows, shares.SourceRows)
    assert not set(c.PER_TOKEN_COLUMNS) & set(rows.inputs.columns)
    one = shares.rank_batch(batch, 1, [0, 16, 32, 48, 64])
    assert one.rank_rows is not None and one.rank_rows.inputs.height == 16


@pytest.mark.parametrize("damage", ["truncated", "dangling symlink"])
def test_an_unreadable_file_is_reported_as_in_memory(tmp_path: Path, damage: str) -> None:
    """A Parquet file whose footer does not read is one share, read as the in-memory read
    reads it: the same line."""
    folder = layouts.three_files_one_without_loss_mask(tmp_path / "in")
    broken = folder / "step=0" / "part-1.parquet"
    if damage == "truncated":
        broken.write_bytes(broken.read_bytes()[:-100])
    else:
        broken.unlink()
        broken.symlink_to(tmp_path / "gone.parquet")
    settings = Settings(global_batch_size=64, dp_size=4)
    memory = _refusal(folder, tmp_path / "memory", settings, False)
    assert _refusal(folder, tmp_path / "tasks", settings, True) == memory
    assert "unreadable_file" in memory and "part-1.parquet" in memory
