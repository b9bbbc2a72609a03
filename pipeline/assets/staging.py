"""The staging area: the intermediate assets as Parquet under `<output root>/.staging/`."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from pipeline.build import SampleTable, TrainBatch, load_sample_table, save_sample_table
from pipeline.errors import UsageError
from pipeline.io import writer
from pipeline.roots import StepRoots
from pipeline.settings import Settings

SAMPLES = "rollout_samples"
BATCH = "train_batch"
SETTINGS = "settings.json"


def _commit(final: Path, save: Callable[[Path], None]) -> None:
    """Write into a fresh sibling folder, then swap it in: a reader sees the old or the new.
    What killed stages of this host left beside it is removed first, as the writer does."""
    final.parent.mkdir(parents=True, exist_ok=True)
    writer.clean_stale(final.parent)
    staged = final.parent / writer.private_name("tmp", final.name)
    try:
        save(staged)
        writer.commit_folder(staged, final)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def _existing(folder: Path, asset: str, step: int) -> Path:
    if not folder.is_dir():
        raise UsageError(
            f"step {step} has no staged {asset} at {folder}: materialize {asset} first"
        )
    return folder


def save_samples(roots: StepRoots, samples: SampleTable, settings: Settings) -> Path:
    """Stage a step's validated samples with the settings they were validated under."""
    folder = roots.staging_folder(SAMPLES, samples.step)

    def save(target: Path) -> None:
        save_sample_table(samples, target)
        (target / SETTINGS).write_text(settings.model_dump_json())

    _commit(folder, save)
    return folder


def load_samples(roots: StepRoots, step: int) -> tuple[SampleTable, Settings]:
    folder = _existing(roots.staging_folder(SAMPLES, step), SAMPLES, step)
    settings = Settings.model_validate_json((folder / SETTINGS).read_text())
    return load_sample_table(folder), settings


def save_batch(roots: StepRoots, batch: TrainBatch) -> Path:
    folder = roots.staging_folder(BATCH, batch.step)
    _commit(folder, batch.save)
    return folder


def load_batch(roots: StepRoots, step: int) -> TrainBatch:
    return TrainBatch.load(_existing(roots.staging_folder(BATCH, step), BATCH, step))
