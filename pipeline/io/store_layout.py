"""Where a step's files are in an object store (CONTRACT "Committing on object storage").

    step=<N>/manifest.json                      the commit point, written last
    step=<N>/_attempts/<id>/rank=<R>.parquet    the files of the build that manifest names
    step=<N>/_attempts/<id>/_quarantine/step=<N>.parquet

`<id>` is the head of the manifest's own seal (`manifest_sha256`): the manifest names its
files without a field of its own, so it is byte for byte the manifest of a local build.
The loader computes the same (loader/rollout_shards_loader/_remote.py).
"""

from __future__ import annotations

import json

from pipeline.manifest import MANIFEST

ATTEMPTS = "_attempts"
ATTEMPT_CHARS = 16


def manifest_key(step: int) -> str:
    return f"step={step}/{MANIFEST}"


def attempts_prefix(step: int) -> str:
    return f"step={step}/{ATTEMPTS}/"


def attempt_of(manifest_json: str | bytes) -> str:
    """The attempt id a manifest names: the head of its seal."""
    return str(json.loads(manifest_json)["manifest_sha256"])[:ATTEMPT_CHARS]


def output_key(step: int, attempt: str, path: str) -> str:
    """Where the output the manifest lists as `path` is stored: under the attempt prefix,
    the quarantine's `../_quarantine/...` inside it too."""
    return f"{attempts_prefix(step)}{attempt}/{path.removeprefix('../')}"
