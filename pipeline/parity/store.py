"""A build in an object store as a side of a parity check: each committed step's rank
files, those its manifest names (never a listing of the attempts)."""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.columns import RANK_POSITION
from pipeline.errors import StepError, UsageError, Violation
from pipeline.io import storage
from pipeline.io.discovery import STEP_FOLDER
from pipeline.io.load import read_object
from pipeline.io.storage import ObjectRoot
from pipeline.io.store_layout import attempt_of, output_key
from pipeline.manifest import MANIFEST, Manifest


def _manifest_keys(root: ObjectRoot) -> list[str]:
    """The committed steps' manifests under the root, by step (one LIST)."""
    keys = []
    for listed in storage.listing(root, ""):
        folder, _, name = listed.key.partition("/")
        if name == MANIFEST and STEP_FOLDER.match(folder):
            keys.append(listed.key)
    return sorted(keys, key=lambda key: int(key.split("/")[0].removeprefix("step=")))


def is_build(root: ObjectRoot) -> bool:
    """An output root in the store: it holds a committed step."""
    return bool(_manifest_keys(root))


def read_build(root: ObjectRoot) -> pl.DataFrame:
    """Every shard row of the build with its step, rank and position in its rank's file."""
    frames = []
    for key in _manifest_keys(root):
        stored = storage.get(root, key)
        try:
            manifest = Manifest.from_json(stored.data if stored else b"")
        except ValueError as exc:
            message = f"not a step manifest ({type(exc).__name__}: {exc})"
            files = [root.url(key)]
            raise StepError([Violation("unreadable_file", message, files=files)]) from None
        attempt = attempt_of(manifest.to_json())
        for rank, output in enumerate(manifest.rank_outputs()):
            url = root.url(output_key(manifest.step, attempt, output.path))
            frames.append(
                read_object(storage.ObjectPath(url), manifest.step).frame.with_columns(
                    pl.lit(manifest.step, dtype=pl.Int64).alias(c.STEP),
                    pl.lit(rank, dtype=pl.Int32).alias(c.RANK),
                    pl.int_range(pl.len(), dtype=pl.Int64).alias(RANK_POSITION),
                )
            )
    if not frames:
        raise UsageError(f"{root}: no committed step in the store")
    return pl.concat(frames, how="diagonal_relaxed")
