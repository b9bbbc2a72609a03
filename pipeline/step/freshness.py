"""Is step N current? One answer for the CLI, the sensor and the schedule.

A step folder is current when its manifest says it was built from files with these
checksums, in this batch order, with these settings, and its files are there as written.
Hashing is the expensive part, so the sensor and the schedule first compare cheap file
stats (`stat_fingerprint`, `recorded_sha256`) and hash only what changed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from pipeline.io import storage, writer
from pipeline.io.checksums import input_digest, sha256_of
from pipeline.io.discovery import SourceFile
from pipeline.io.regular import read_regular
from pipeline.io.storage import ObjectPath
from pipeline.manifest import MANIFEST, Manifest, input_path
from pipeline.settings import Settings

MISSING = "missing"
STALE = "stale"
# 64 bits tell the versions of one step apart; a sensor cursor of 10k steps stays small.
DIGEST_CHARS = 16


def read_manifest(out_root: Path, step: int) -> Manifest | None:
    """A committed step's manifest, or None when the step folder is absent, incomplete, or
    its manifest is not one this project writes (then the step is rebuilt)."""
    return manifest_at(writer.step_folder(out_root, step) / MANIFEST)


def manifest_at(path: Path) -> Manifest | None:
    """The manifest at `path`; None when it is missing, unreadable, not a regular file
    (a FIFO there is never waited on) or of another shape."""
    try:
        return Manifest.from_json(read_regular(path))
    except (OSError, ValueError):
        return None


def _folder_matches(manifest: Manifest, folder: Path, hash_outputs: bool) -> bool:
    """The folder holds exactly the rank files the manifest lists, the root's quarantine
    file is there exactly when rows were set aside, its counts add up, and with
    `hash_outputs` every file's sha256 matches."""
    ranks = {writer.rank_file(rank) for rank in range(manifest.dp_size)}
    quarantine = writer.quarantine_output(manifest.step)
    report = {manifest.report} if manifest.report is not None else set()
    expected = ranks | report | ({quarantine} if manifest.counts.quarantined else set())
    listed = {output.path for output in manifest.outputs}
    try:
        present = {entry.name for entry in folder.iterdir()} - {MANIFEST}
    except OSError:
        return False
    quarantined = (folder / quarantine).is_file()
    if listed != expected or present != ranks | report or not manifest.counts.add_up():
        return False
    if quarantined != bool(manifest.counts.quarantined):
        return False
    if not hash_outputs:
        return True
    try:
        return all(sha256_of(folder / o.path) == o.sha256 for o in manifest.outputs)
    except OSError:  # a file gone, or no longer a regular file (a FIFO is never read)
        return False


def shards_are_current(
    manifest: Manifest | None, input_sha256: Sequence[str], settings: Settings
) -> bool:
    """True when a step was written from files with these checksums, in this batch order,
    and with these settings: building it again would give the same shards."""
    if manifest is None:
        return False
    same_inputs = [record.sha256 for record in manifest.inputs] == list(input_sha256)
    return same_inputs and manifest.settings == settings.to_dict()


def current_manifest(
    step: int, sources: Sequence[SourceFile], settings: Settings, out_root: Path
) -> Manifest | None:
    """The manifest of a complete step folder built from these very inputs (same paths,
    same sha256, same order) with these settings, whose files are all there unchanged;
    None when the step must be built."""
    manifest = read_manifest(out_root, step)
    if manifest is None:  # a first build: no need to hash the inputs here
        return None
    if [record.path for record in manifest.inputs] != [input_path(s.path) for s in sources]:
        return None
    checksums = [input_digest(source.path) for source in sources]
    if not shards_are_current(manifest, checksums, settings):
        return None
    if not _folder_matches(manifest, writer.step_folder(out_root, step), hash_outputs=True):
        return None
    return manifest


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:DIGEST_CHARS]


def stat_fingerprint(sources: Sequence[SourceFile], settings: Settings) -> str:
    """Cheap: paths, sizes and mtimes of a step's files, and the settings. An object's
    size and entity tag stand for its stat (one HEAD): its bytes change, so does the tag."""
    stats = []
    for source in sources:
        if isinstance(source.path, ObjectPath):
            head = storage.head_of(source.path)
            stats.append(f"{source.path}:{head.size}:{head.etag}" if head else f"{source.path}:-")
            continue
        st = _stat(source.path)
        stats.append(f"{source.path}:{st.st_size}:{st.st_mtime_ns}" if st else f"{source.path}:-")
    return _digest(settings.to_json(), *stats)


def content_hash(input_sha256: Sequence[str], settings: Settings) -> str:
    """What a build of the step depends on: its files' bytes in batch order, and the settings."""
    return _digest(settings.to_json(), *input_sha256)


def recorded_sha256(
    sources: Sequence[SourceFile], manifest: Manifest, manifest_path: Path
) -> list[str]:
    """The inputs' checksums; the manifest's own record when no file is newer than it, which
    spares hashing every input of every step on every tick."""
    recorded = [record.sha256 for record in manifest.inputs]
    written_ns = manifest_path.stat().st_mtime_ns
    stats = [_stat(source.path) for source in sources]
    unchanged = len(recorded) == len(sources) and all(
        st is not None and st.st_mtime_ns <= written_ns for st in stats
    )
    return recorded if unchanged else [input_digest(source.path) for source in sources]


def _stat(path: Path) -> os.stat_result | None:
    """The file's stat; a dangling symlink's own (its step is built to name it), None
    for a file gone since it was found."""
    try:
        return path.stat()
    except OSError:
        try:
            return path.lstat()
        except OSError:
            return None


def shard_state(
    out_root: Path, step: int, sources: Sequence[SourceFile], settings: Settings
) -> str | None:
    """`missing` (no complete folder), `stale` (inputs or settings changed since the
    manifest, or files missing or extra), or None when current."""
    manifest = read_manifest(out_root, step)
    folder = writer.step_folder(out_root, step)
    if manifest is None:
        return MISSING
    hashes = recorded_sha256(sources, manifest, folder / MANIFEST)
    current = shards_are_current(manifest, hashes, settings)
    return None if current and _folder_matches(manifest, folder, hash_outputs=False) else STALE
