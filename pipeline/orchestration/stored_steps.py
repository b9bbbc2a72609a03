"""A committed step as the sensor, the schedule and the shard checks read it, wherever the
output root is: a local folder, or an object store (`io.store_layout`).

The checks read a step's files as files (Parquet footers, sha256, the quarantine's
reasons). For a step in an object store they read a copy: the manifest and the files it
names, fetched by one GET each into a temporary folder laid out as a local output root,
kept for the process and removed at its exit. The five checks of a step share one copy
while the files stay as they are: one LIST of the attempt's prefix compares their entity
tags, and a file rewritten in the store since is fetched again.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

from pipeline.io import storage, writer
from pipeline.io.discovery import SourceFile
from pipeline.io.storage import ObjectRoot
from pipeline.io.store_layout import attempt_of, attempts_prefix, manifest_key, output_key
from pipeline.manifest import MANIFEST, Manifest, input_path
from pipeline.settings import Settings
from pipeline.step import freshness
from pipeline.step.store_commit import current_in_store, files_there, stored_manifest


def manifest_of(out_root: Path | ObjectRoot, step: int) -> Manifest | None:
    """The committed manifest of `step`; None when there is none (or of another shape)."""
    if isinstance(out_root, ObjectRoot):
        return stored_manifest(out_root, step)[0]
    return freshness.read_manifest(out_root, step)


def committed_step(out_root: Path | ObjectRoot, step: int) -> tuple[Path, Manifest | None]:
    """The folder the step's files are read from, and its manifest. In an object store, the
    folder of a local copy of the committed files (the step's URL when there is none)."""
    if not isinstance(out_root, ObjectRoot):
        return writer.step_folder(out_root, step), freshness.read_manifest(out_root, step)
    stored = storage.get(out_root, manifest_key(step))
    manifest = None
    if stored is not None:
        with suppress(ValueError):  # of another shape: the checks say it is unreadable
            manifest = Manifest.from_json(stored.data)
    if stored is None or manifest is None:
        return storage.object_path(out_root, f"step={step}"), None
    attempt = attempt_of(stored.data)
    listed = storage.listing(out_root, f"{attempts_prefix(step)}{attempt}/")
    tags = tuple((item.key, item.size, item.etag) for item in listed)
    return _copy(out_root.uri, step, stored.data, tags), manifest


@functools.cache
def _scratch() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="rollout-shards-checks-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


@functools.cache
def _copy(uri: str, step: int, manifest_json: bytes, tags: tuple[object, ...]) -> Path:
    """The step's files under `<scratch>/<attempt>/step=<N>/`, its quarantine beside it as
    in a local root; a file the store no longer has is left out (the checks say so)."""
    root, attempt = ObjectRoot(uri), attempt_of(manifest_json)
    folder = writer.step_folder(_scratch() / f"{attempt}-{hash(tags) & 0xFFFFFFFF:08x}", step)
    shutil.rmtree(folder.parent, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_bytes(manifest_json)
    for output in Manifest.from_json(manifest_json).outputs:
        stored = storage.get(root, output_key(step, attempt, output.path))
        if stored is not None:
            target = folder / output.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(stored.data)
    return folder


def store_shard_state(
    root: ObjectRoot, step: int, sources: Sequence[SourceFile], settings: Settings
) -> str | None:
    """`freshness.shard_state` for a step in an object store: `missing`, `stale` or None.
    An input written before the manifest keeps the sha256 the manifest recorded (one HEAD
    each, as a stat); a later one, or one of the same second, is hashed (one GET)."""
    manifest = manifest_of(root, step)
    written = storage.head(root, manifest_key(step))
    if manifest is None or written is None:
        return freshness.MISSING
    heads = [storage.head_of(source.path) for source in sources]  # type: ignore[arg-type]
    unchanged = len(manifest.inputs) == len(sources) and all(
        head is not None and head.modified < written.modified for head in heads
    )
    if unchanged and [r.path for r in manifest.inputs] == [input_path(s.path) for s in sources]:
        hashes = [record.sha256 for record in manifest.inputs]
        current = freshness.shards_are_current(manifest, hashes, settings)
        return None if current and files_there(root, manifest) else freshness.STALE
    return None if current_in_store(manifest, sources, settings, root) else freshness.STALE
