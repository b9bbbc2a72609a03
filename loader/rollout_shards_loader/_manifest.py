"""A step's manifest as the loader reads it: one JSON object whose fields have the types
the build writes (docs/contract.md, "The manifest"), checked field by field before any is
used, sealed by its `manifest_sha256`, and whose `step` is the folder's.

JSON types are taken strictly: `true` is not the integer 1, `"2"` is not 2, and a float
field takes a JSON number (an integer or a float, never a boolean). A field the loader
reads that has another type, or a required one that is missing, is one
ShardVerificationError naming the manifest and the field; so is a manifest whose fields are
not those its `manifest_sha256` seals (edited after its build).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollout_shards_loader._consistent import check_layout
from rollout_shards_loader._folder import (
    MANIFEST,
    Folder,
    Replaced,
    ShardVerificationError,
    open_folder,
)

STEP_NAME = re.compile(r"^step=([0-9]+)$")  # ASCII digits: `step=١` is no step
# Reads started over when the step folder was replaced under the reader; each rebuild
# that lands during one read costs one.
ATTEMPTS = 8

Check = tuple[Callable[[Any], bool], str]


def _is_int(value: Any) -> bool:
    return type(value) is int  # a bool is an int to isinstance


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _is_text(value: Any) -> bool:
    return type(value) is str


def _list_of(item: Callable[[Any], bool], null_items: bool = False) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return type(value) is list and all(item(v) or (null_items and v is None) for v in value)

    return check


def _or_null(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


INTEGER: Check = (_is_int, "an integer")
COUNT: Check = (lambda v: _is_int(v) and v >= 0, "an integer >= 0")
POSITIVE: Check = (lambda v: _is_int(v) and v >= 1, "an integer >= 1")
TEXT: Check = (_is_text, "a string")
INTEGERS: Check = (_list_of(_is_int), "a list of integers")
# The fields the loader reads: required ones, then those a manifest may lack (written
# before they existed), each with its type.
OBJECT: Check = (lambda v: type(v) is dict, "an object")
REQUIRED: dict[str, Check] = {
    "step": INTEGER,
    "settings": OBJECT,
    "outputs": (lambda v: type(v) is list, "a list"),
    "counts": OBJECT,
}
OPTIONAL: dict[str, Check] = {
    "manifest_sha256": TEXT,
    "num_train_steps": COUNT,
    "dynamic_global_batch_size": (_or_null(_is_int), "an integer or null"),
    "num_microbatches": (_or_null(_list_of(_is_int)), "a list of integers or null"),
    "num_rollouts": INTEGERS,
    "present_columns": (_list_of(_is_text), "a list of strings"),
    "dropped_positions": INTEGERS,
    "dropped_raw_reward": (_list_of(_is_number, null_items=True), "a list of numbers or nulls"),
}
COUNTS: dict[str, Check] = {"written": COUNT, "dropped": COUNT}
# The settings each trainer's reader takes from the manifest (a manifest records the
# chosen trainer's settings; one without `trainer` is miles'), and the other fields it
# needs. A new trainer's reader adds its line to each.
SETTINGS: dict[str, dict[str, Check]] = {
    "miles": {"dp_size": POSITIVE, "global_batch_size": POSITIVE},
    "slime": {"dp_size": POSITIVE, "global_batch_size": POSITIVE},
    "verl": {
        "dp_size": POSITIVE,
        "max_prompt_length": POSITIVE,
        "max_response_length": POSITIVE,
        "pad_token_id": INTEGER,
        "rollout_n": POSITIVE,
        "train_batch_size": POSITIVE,
    },
}
FIELDS: dict[str, dict[str, Check]] = {
    "miles": {},
    "slime": {
        "global_batch_size": POSITIVE,
        "num_train_steps": COUNT,
        "num_rollouts": INTEGERS,
        "num_microbatches": INTEGERS,
    },
    "verl": {"global_batch_size": POSITIVE},
}
OUTPUT: dict[str, Check] = {"path": TEXT, "sha256": TEXT, "rows": COUNT}
OUTPUT_OPTIONAL: dict[str, Check] = {"raw_reward_sha256": (_or_null(_is_text), "a string or null")}


def read_manifest(step_folder: str | Path) -> dict[str, Any]:
    """The step's `manifest.json` as a dict, its fields checked (ShardVerificationError
    naming a field of another type); FileNotFoundError when the folder has none (a step
    folder without one is incomplete)."""
    path = Path(step_folder)
    for attempt in range(ATTEMPTS):
        folder = open_folder(path)
        try:
            return load_manifest(folder)
        except Replaced:
            time.sleep(0.002 * (attempt + 1))
        finally:
            folder.close()
    raise RuntimeError(f"{path}: replaced by other builds {ATTEMPTS} times while it was read")


def load_manifest(folder: Folder, trainer: str | None = None) -> dict[str, Any]:
    """The manifest of the open step folder, its fields and its step checked; a step built
    for another trainer than `trainer` (when given) is a ValueError naming its reader."""
    path = folder.path / MANIFEST
    try:
        raw = folder.read(MANIFEST)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no manifest, so {folder.path} is not a complete step"
        ) from None
    try:
        manifest = json.loads(bytes(raw))
    except (ValueError, RecursionError):
        raise ShardVerificationError(f"{path}: not a JSON manifest") from None
    check_fields(manifest, path, trainer)
    _check_step(folder.path, manifest)
    check_layout(manifest, path, trainer_of(manifest))
    return manifest


def manifest_sha256(manifest: dict[str, Any]) -> str:
    """The digest that seals a manifest: sha256 of its JSON without `manifest_sha256`, keys
    sorted, no spaces, ASCII (pipeline/manifest.py computes it when it writes one)."""
    fields = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def check_fields(manifest: Any, path: Path, expected: str | None = None) -> None:
    """Every field the loader reads has the type the build writes; a step built for
    another trainer than `expected` (when given) is a ValueError naming its reader."""
    if type(manifest) is not dict:
        raise ShardVerificationError(f"{path}: not a rollout-shards manifest (not an object)")
    _check(manifest, REQUIRED, OPTIONAL, "", path)
    _check(manifest["settings"], {}, {"trainer": TEXT}, "settings.", path)
    _check(manifest["counts"], COUNTS, {}, "counts.", path)
    trainer = trainer_of(manifest)
    if trainer not in SETTINGS:
        raise ShardVerificationError(
            f"{path}: built for the {trainer!r} trainer, which this loader does not read "
            f"(it reads {', '.join(SETTINGS)})"
        )
    _check(manifest["settings"], SETTINGS[trainer], {}, "settings.", path)
    _check(manifest, FIELDS[trainer], {}, "", path)
    for i, output in enumerate(manifest["outputs"]):
        if type(output) is not dict:
            raise _wrong_type(path, f"outputs[{i}]", output, "an object")
        _check(output, OUTPUT, OUTPUT_OPTIONAL, f"outputs[{i}].", path)
    sealed = manifest.get("manifest_sha256")
    if sealed is not None and sealed != manifest_sha256(manifest):
        raise ShardVerificationError(
            f"{path}: its fields are not those its build wrote (they do not give its "
            f"manifest_sha256 {sealed[:12]}...): the manifest was edited after the build; "
            "rebuild the step (rollout-shards build ... --force)"
        )
    if expected is not None and trainer != expected:
        raise ValueError(
            f"{path}: built for the {trainer} trainer (--trainer {trainer}), not {expected}: "
            f"read its ranks with rollout_shards_loader.{trainer}.read_rank"
        )
    dropped = len(manifest.get("dropped_positions", []))
    if len(manifest.get("dropped_raw_reward", [])) != dropped:
        raise ShardVerificationError(
            f"{path}: `dropped_raw_reward` has {len(manifest['dropped_raw_reward'])} values "
            f"for {dropped} `dropped_positions`: not a rollout-shards manifest"
        )
    if manifest.get("num_microbatches") is not None and "num_rollouts" not in manifest:
        raise ShardVerificationError(
            f"{path}: not a rollout-shards manifest (`num_microbatches` without `num_rollouts`)"
        )


def trainer_of(manifest: dict[str, Any]) -> Any:
    """The trainer a step was built for (miles when the manifest predates the setting)."""
    return manifest["settings"].get("trainer", "miles")


def _check(
    record: dict[str, Any],
    required: dict[str, Check],
    optional: dict[str, Check],
    prefix: str,
    path: Path,
) -> None:
    for name, (valid, expected) in required.items():
        if name not in record:
            raise ShardVerificationError(
                f"{path}: not a rollout-shards manifest (no `{prefix}{name}`)"
            )
        if not valid(record[name]):
            raise _wrong_type(path, prefix + name, record[name], expected)
    for name, (valid, expected) in optional.items():
        if name in record and not valid(record[name]):
            raise _wrong_type(path, prefix + name, record[name], expected)


def _wrong_type(path: Path, field: str, value: Any, expected: str) -> ShardVerificationError:
    shown = json.dumps(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return ShardVerificationError(
        f"{path}: `{field}` is {shown} (JSON {_json_type(value)}), not {expected}: not a "
        "rollout-shards manifest"
    )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _check_step(folder: Path, manifest: dict[str, Any]) -> None:
    match = STEP_NAME.match(folder.name)
    if match and manifest["step"] != int(match.group(1)):
        raise ShardVerificationError(
            f"{folder / MANIFEST}: the manifest of step {manifest['step']}, in the folder "
            f"of step {match.group(1)}"
        )
