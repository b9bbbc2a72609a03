"""Import miles' own rollout dumps: one row per sample, with CONTRACT section 1 columns.

miles writes each file with `torch.save(dict(rollout_id=<step>, metadata=<trim metadata>,
samples=[Sample.to_dict(), ...]))` (radixark/miles `miles/ray/rollout/debug_data.py`,
`save_debug_rollout_data`; slime writes the same minus `metadata`). Finding the files is
`pipeline.io.dump_files`; unpickling them safely is `pipeline.io.dump_pickle`; this module
maps the samples to columns, each of the type the column table (`pipeline.columns`) gives
it, through `pipeline.io.dump_values`, which checks the unpickled values on the way.

The session version is not stored. v2 leaves carry `metadata["leaf"]` (a descriptor
`{node_id, parent, path_node_ids, response_id}`, miles `session/v2/assembly.py`); the
single v1 sample gets the session server's TITO bookkeeping merged into its metadata
(`accumulated_token_ids`, `max_trim_tokens`, `tito_session_mismatch`;
`generate_hub/agentic_tool_call.py`). Those v1 keys differ across miles versions and
forks, so `session_version=` is the reliable way to label a dump.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, UsageError, step_error
from pipeline.io.dump_files import find_miles_dumps, is_miles_dump, named_step
from pipeline.io.dump_pickle import VALUES_PER_BYTE, Budget, TooBig, load_payload
from pipeline.io.dump_values import (
    LISTS,
    Malformed,
    Plain,
    Sizes,
    column_series,
    field_error,
    json_text,
    plain_value,
    preview,
)

__all__ = ["find_miles_dumps", "is_miles_dump", "read_miles_dump"]

V1_SESSION_KEYS = ("accumulated_token_ids", "max_trim_tokens", "tito_session_mismatch")
LEAF_KEY = "leaf"
LEGACY_WEIGHT_VERSIONS_KEY = "legacy_weight_versions"

ALWAYS_PRESENT = frozenset(
    (c.STEP, c.INDEX, c.LEAF, c.STATUS, c.TOKENS, c.RESPONSE_LENGTH, c.REWARD, c.REMOVE_SAMPLE)
)
# Each input column's type, from the column table (a struct reward's fields take its type).
TYPES: dict[str, pl.DataType] = {col.name: col.input for col in c.INPUT_COLUMNS if col.input}


def _json_field(
    samples: list[dict[str, Any]], key: str, sizes: Sizes, path: Path
) -> list[str | None]:
    values = []
    for position, sample in enumerate(samples):
        value = sample.get(key)
        try:
            values.append(json_text(value, sizes, f"field {key} of sample {position}"))
        except Malformed as exc:
            raise field_error(path, key, None, position, value, str(exc)) from None
    return values


def _status(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    return text.removeprefix("status.")


def _flag(value: Any, plain: Plain) -> Any:
    """miles' `remove_sample` is a bool (False when absent); anything else is refused by
    its Boolean column, never read as true or false."""
    return False if value is None else plain(value)


def _weight_versions(samples: list[dict[str, Any]], path: Path, plain: Plain) -> list[list[str]]:
    """Versions in call order: legacy dumps hold strings, current ones per-call span lists."""
    budget = plain.budget
    found: list[list[str]] = []
    for position, sample in enumerate(samples):
        raw = plain(sample.get(c.WEIGHT_VERSIONS))
        if raw is None or (type(raw) in LISTS and not raw):
            legacy = plain(sample.get(LEGACY_WEIGHT_VERSIONS_KEY))
            raw = raw if legacy is None else legacy
        if raw is None:
            found.append([])
            continue
        if type(raw) not in LISTS:
            reason = f"a {type(raw).__name__} where a list of versions belongs"
            raise field_error(path, c.WEIGHT_VERSIONS, None, position, raw, reason)
        budget.charge(len(raw), f"field {c.WEIGHT_VERSIONS} of sample {position}")
        versions: list[str] = []
        for call in raw:
            spans = call if type(call) in LISTS else (call,)
            budget.charge(len(spans), f"field {c.WEIGHT_VERSIONS} of sample {position}")
            for span in spans:
                version = span.get("version") if isinstance(span, dict) else span
                if version is None:
                    continue
                if type(version) is not str:
                    kind = type(version).__name__
                    reason = f"version {preview(version)} is a {kind}, not a string"
                    raise field_error(path, c.WEIGHT_VERSIONS, None, position, raw, reason)
                budget.charge(len(version), f"field {c.WEIGHT_VERSIONS} of sample {position}")
                versions.append(version)
        found.append(versions)
    return found


def _session_version(metadata: dict[str, Any]) -> str | None:
    if LEAF_KEY in metadata:
        return "v2"
    if any(key in metadata for key in V1_SESSION_KEYS):
        return "v1"
    return None


def _reward_values(rewards: list[Any], path: Path, plain: Plain) -> tuple[list[Any], pl.DataType]:
    """Scalars as float64; dicts as a struct of their numeric fields."""
    dicts = [i for i, r in enumerate(rewards) if isinstance(r, dict)]
    if not dicts:
        return rewards, TYPES[c.REWARD]
    scalars = [i for i, r in enumerate(rewards) if r is not None and not isinstance(r, dict)]
    if scalars:
        raise step_error(
            "malformed_dump",
            f"{path}: reward is a dict on sample {dicts[0]} but a number on sample {scalars[0]}",
        )
    named = [None if r is None else {str(k): plain(v) for k, v in r.items()} for r in rewards]
    keys = list(dict.fromkeys(key for r in named if r is not None for key in r))
    # Text fields (a parsed answer, a judge's note) cannot be float64: keep the numeric ones.
    numeric = [
        key
        for key in keys
        if all(isinstance(r.get(key), (int, float, type(None))) for r in named if r is not None)
    ]
    if not numeric:
        raise step_error("malformed_dump", f"{path}: reward dicts have no numeric field")
    values = [None if r is None else {key: r.get(key) for key in numeric} for r in named]
    return values, pl.Struct(dict.fromkeys(numeric, TYPES[c.REWARD]))


def _payload_step(payload: dict[str, Any], path: Path) -> int:
    named = named_step(path)
    raw = plain_value(payload.get("rollout_id"))
    if raw is None:
        if named is None:
            raise step_error(
                "malformed_dump", f"{path}: no rollout_id in the dump and no step in its name"
            )
        return named
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise step_error(
            "malformed_dump", f"{path}: rollout_id {preview(raw)} is not a step number"
        )
    if named is not None and named != raw:
        raise step_error(
            "step_mismatch",
            f"{path}: the file is named for step {named} but holds rollout_id {raw}",
            step=raw,
        )
    return raw


def _field(samples: Iterable[dict[str, Any]], key: str, plain: Plain) -> list[Any]:
    return [plain(sample.get(key)) for sample in samples]


def read_miles_dump(path: Path, session_version: str | None = None) -> pl.DataFrame:
    """One row per sample of a miles dump, with CONTRACT section 1 names and types.

    `session_version` ("v1" or "v2") labels every row; otherwise rows with
    `metadata["leaf"]` are v2, rows with the v1 session keys are v1, the rest null.
    Optional columns appear only when some sample has a value.
    """
    if session_version not in (None, "v1", "v2"):
        raise UsageError(f"session_version must be v1 or v2, not {session_version!r}")
    path = Path(path)
    payload = load_payload(path)
    if not isinstance(payload, dict) or not isinstance(payload.get("samples"), list):
        raise step_error(
            "malformed_dump", f"{path}: expected a dict with a 'samples' list (a miles dump)"
        )
    step = _payload_step(payload, path)
    samples: list[dict[str, Any]] = payload["samples"]
    for position, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise step_error(
                "malformed_dump",
                f"{path}: sample {position} is a {type(sample).__name__}, not a dict",
                step=step,
            )
    try:
        return _samples_frame(samples, step, path, session_version)
    except StepError as error:
        for violation in error.violations:
            violation.step = step
        raise
    except TooBig as exc:
        raise step_error("malformed_dump", f"{path}: {exc}", step=step) from None
    except RecursionError:
        raise step_error(
            "malformed_dump", f"{path}: a sample holds a value nested too deeply", step=step
        ) from None


def _samples_frame(
    samples: list[dict[str, Any]], step: int, path: Path, session_version: str | None
) -> pl.DataFrame:
    budget = Budget(path.stat().st_size, VALUES_PER_BYTE, "values")
    plain = Plain(budget)
    metadata = [sample.get(c.METADATA) or {} for sample in samples]
    for position, meta in enumerate(metadata):
        if not isinstance(meta, dict):
            raise step_error(
                "malformed_dump", f"{path}: metadata of sample {position} is not a dict"
            )

    leaves: list[int] = []
    seen: dict[Any, int] = {}
    for position, (sample, meta) in enumerate(zip(samples, metadata, strict=True)):
        index = plain(sample.get(c.INDEX))
        # An index that is not a number (a list, a dict) is refused by the index column
        # below; here it only must not count as a leaf of another sample.
        key = index if isinstance(index, (int, float, str, type(None))) else ("sample", position)
        order = seen.get(key, 0)
        seen[key] = order + 1
        leaf = plain(meta.get(LEAF_KEY))
        # Real v2 leaves carry a descriptor dict; only a bare number is a position.
        leaves.append(leaf if isinstance(leaf, int) and not isinstance(leaf, bool) else order)

    versions = (
        [session_version] * len(samples)
        if session_version is not None
        else [_session_version(meta) for meta in metadata]
    )
    weight_versions = _weight_versions(samples, path, plain)
    rewards, reward_dtype = _reward_values(_field(samples, c.REWARD, plain), path, plain)
    sizes = Sizes(budget)

    values: dict[str, list[Any]] = {
        c.STEP: [step] * len(samples),
        c.GROUP_INDEX: _field(samples, c.GROUP_INDEX, plain),
        c.INDEX: _field(samples, c.INDEX, plain),
        c.LEAF: leaves,
        c.ROLLOUT_ID: _field(samples, c.ROLLOUT_ID, plain),
        c.SESSION_VERSION: versions,
        c.STATUS: [_status(s.get(c.STATUS)) for s in samples],
        c.TOKENS: _field(samples, c.TOKENS, plain),
        c.RESPONSE_LENGTH: _field(samples, c.RESPONSE_LENGTH, plain),
        c.LOSS_MASK: _field(samples, c.LOSS_MASK, plain),
        c.REWARD: rewards,
        c.REMOVE_SAMPLE: [_flag(s.get(c.REMOVE_SAMPLE), plain) for s in samples],
        c.ROLLOUT_LOG_PROBS: _field(samples, c.ROLLOUT_LOG_PROBS, plain),
        c.TEACHER_LOG_PROBS: _field(samples, c.TEACHER_LOG_PROBS, plain),
        c.SAMPLING_MASK_IDS: _field(samples, c.SAMPLING_MASK_IDS, plain),
        c.SAMPLING_MASK_OFFSETS: _field(samples, c.SAMPLING_MASK_OFFSETS, plain),
        c.WEIGHT_VERSIONS: weight_versions if any(weight_versions) else [None] * len(samples),
        c.RAW_REWARD: [plain(m.get(c.RAW_REWARD)) for m in metadata],
        c.ROUND_NUMBER: [plain(m.get(c.ROUND_NUMBER)) for m in metadata],
        c.TRAIN_METADATA: _json_field(samples, c.TRAIN_METADATA, sizes, path),
        c.PROMPT: _json_field(samples, c.PROMPT, sizes, path),
        c.METADATA: _json_field(samples, c.METADATA, sizes, path),
    }
    types = {**TYPES, c.REWARD: reward_dtype}
    held = [name for name in c.NOT_CARRIED if any(s.get(name) is not None for s in samples)]
    if held:
        raise step_error(
            "input_not_carried",
            f"{path}: samples hold {', '.join(held)}, which miles trains on and the shards do "
            "not carry: convert such steps in miles",
            step,
        )
    series = [
        column_series(name, column, types[name], path, budget)
        for name, column in values.items()
        if name in ALWAYS_PRESENT or any(v is not None for v in column)
    ]
    return pl.DataFrame(series)
