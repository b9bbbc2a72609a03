"""The staging area: the intermediate assets as Parquet under `<output root>/.staging/`.

Only a stage that runs on its own (one asset materialized apart from the others) reads
what the previous stage left here, and a stage stages its output only when the next stage
does not run with it; stages that run together hand the frames over in memory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.errors import UsageError
from pipeline.io import writer
from pipeline.manifest import Manifest
from pipeline.settings import Settings, make_settings
from pipeline.step import ROLLOUT_SAMPLES, TRAIN_BATCH
from pipeline.step.roots import StepRoots
from pipeline.step.tables import SampleTable, TrainBatch

SETTINGS = "settings.json"
META = "meta.json"
SAMPLES_FILE = "samples.parquet"
BATCH_FILE = "batch.parquet"
# Staged assets are written once and read once: lz4 spends less time writing than Polars'
# default zstd, and groups of 4096 rows are read back in parallel.
STAGING_PARQUET: dict[str, Any] = {"compression": "lz4", "row_group_size": 4096}


def _existing(folder: Path, asset: str, step: int) -> Path:
    if not folder.is_dir():
        raise UsageError(
            f"step {step} has no staged {asset} at {folder}: materialize {asset} first"
        )
    return folder


def _save_quarantine(quarantine: pl.DataFrame | None, folder: Path) -> None:
    if quarantine is not None:
        writer.write_staged(quarantine, folder / writer.QUARANTINE, **STAGING_PARQUET)


def _load_quarantine(folder: Path) -> pl.DataFrame | None:
    path = folder / writer.QUARANTINE
    return pl.read_parquet(path) if path.exists() else None


def save_samples(roots: StepRoots, samples: SampleTable, settings: Settings) -> Path:
    """Stage a step's validated samples with the settings they were validated under."""
    folder = roots.staging_folder(ROLLOUT_SAMPLES, samples.step)

    def save(target: Path) -> None:
        writer.write_staged(samples.frame, target / SAMPLES_FILE, **STAGING_PARQUET)
        _save_quarantine(samples.quarantine, target)
        meta = {
            "step": samples.step,
            "inputs": samples.files,
            "ignored_columns": samples.ignored_columns,
            "ingested": samples.ingested,
            "repaired": samples.repaired,
        }
        (target / META).write_text(json.dumps(meta))
        (target / SETTINGS).write_text(settings.to_json())

    writer.replace_folder(folder, save)
    return folder


def load_samples(roots: StepRoots, step: int) -> tuple[SampleTable, Settings]:
    folder = _existing(roots.staging_folder(ROLLOUT_SAMPLES, step), ROLLOUT_SAMPLES, step)
    settings = make_settings(json.loads((folder / SETTINGS).read_text()))
    meta = json.loads((folder / META).read_text())
    samples = SampleTable(
        step=meta["step"],
        frame=pl.read_parquet(folder / SAMPLES_FILE),
        files=meta["inputs"],
        ignored_columns=meta["ignored_columns"],
        ingested=meta["ingested"],
        repaired=meta["repaired"],
        quarantine=_load_quarantine(folder),
    )
    return samples, settings


def save_batch(roots: StepRoots, batch: TrainBatch) -> Path:
    folder = roots.staging_folder(TRAIN_BATCH, batch.step)

    def save(target: Path) -> None:
        writer.write_staged(batch.staged_frame(), target / BATCH_FILE, **STAGING_PARQUET)
        _save_quarantine(batch.quarantine, target)
        (target / META).write_text(batch.meta.to_json())

    writer.replace_folder(folder, save)
    return folder


def load_batch(roots: StepRoots, step: int) -> TrainBatch:
    folder = _existing(roots.staging_folder(TRAIN_BATCH, step), TRAIN_BATCH, step)
    meta = Manifest.from_json((folder / META).read_text())
    return TrainBatch(
        step=meta.step,
        frame=pl.read_parquet(folder / BATCH_FILE),
        meta=meta,
        quarantine=_load_quarantine(folder),
    )


def discard(roots: StepRoots, asset: str, step: int) -> None:
    """Remove the staged copy of `asset` for `step`: a newer one was handed on in memory."""
    shutil.rmtree(roots.staging_folder(asset, step), ignore_errors=True)
