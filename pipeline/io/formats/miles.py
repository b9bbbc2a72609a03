"""Import miles' own rollout dumps: one row per sample, with CONTRACT section 1 columns.

miles writes each file with `torch.save(dict(rollout_id=<step>, metadata=<trim metadata>,
samples=[Sample.to_dict(), ...]))` (radixark/miles `miles/ray/rollout/debug_data.py`,
`save_debug_rollout_data`; slime writes the same minus `metadata`). Finding the files is
`names`; unpickling them safely is `unpickle`; the payload is checked against `DECLARED`
(`declared.check`: a `samples` list of dicts, at least one; a `rollout_id` in int64), and
this module maps the samples to columns, each of the type the column table
(`pipeline.columns`) gives it, through `values`, which checks each value on the way. What
goes wrong is one line through the frame every format shares (`frame.read_dump`).

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
from pipeline.errors import UsageError, Violation, step_error
from pipeline.io.formats import declared as d
from pipeline.io.formats.declared import Malformed
from pipeline.io.formats.frame import DumpFormat, read_dump
from pipeline.io.formats.names import DUMP_SUFFIX, find_miles_dumps, is_miles_dump, named_step
from pipeline.io.formats.unpickle import VALUES_PER_BYTE, Budget, read_torch_save
from pipeline.io.formats.values import (
    LISTS,
    Plain,
    Sizes,
    column_series,
    field_error,
    json_text,
    plain_value,
    preview,
)

__all__ = ["FORMAT", "find_miles_dumps", "is_miles_dump", "read_miles_dump"]

WHAT = "a miles or slime rollout dump"
DECLARED: d.Declared = {
    "rollout_id": d.StepNumber(required=False),
    "samples": d.Rows(dict),
}

V1_SESSION_KEYS = ("accumulated_token_ids", "max_trim_tokens", "tito_session_mismatch")
LEAF_KEY = "leaf"

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


SPAN_KEYS = (c.SPAN_VERSION, c.SPAN_START, c.SPAN_END)
INT64 = range(-(2**63), 2**63)


def _span(span: Any, where: str, plain: Plain) -> dict[str, Any] | str:
    """A span as miles' `WeightVersionSpan(**span)` takes it, a fresh dict; else the
    reason it does not fit. A null field passes to the rules (weight_version_spans_order)."""
    if not isinstance(span, dict):
        return f"{where} is a {type(span).__name__}, not a span dict"
    if set(span) != set(SPAN_KEYS):
        return f"{where} has keys {sorted(map(str, span))}, not {list(SPAN_KEYS)}"
    version, start, end = (plain(span[key]) for key in SPAN_KEYS)
    if version is not None and type(version) is not str:
        return f"{where}: version {preview(version)} is a {type(version).__name__}, not a string"
    for key, value in ((c.SPAN_START, start), (c.SPAN_END, end)):
        if value is not None and (type(value) is not int or value not in INT64):
            return f"{where}: {key} {preview(value)} is not an int64"
    if version is not None:
        plain.budget.charge(len(version), where)
    return {c.SPAN_VERSION: version, c.SPAN_START: start, c.SPAN_END: end}


def _calls(raw: list[Any], position: int, plain: Plain) -> list[list[dict[str, Any]]] | str:
    """The span form: per generation call a list of spans (miles' `from_dicts`)."""
    calls = []
    for at, call in enumerate(raw):
        call = plain(call)
        if type(call) not in LISTS:
            kind = type(call).__name__
            return f"call {at} is a {kind}, not a list of spans (strings and calls mixed?)"
        plain.budget.charge(len(call), f"field {c.WEIGHT_VERSIONS} of sample {position}")
        spans = []
        for k, span in enumerate(call):
            made = _span(plain(span), f"span {k} of call {at}", plain)
            if isinstance(made, str):
                return made
            spans.append(made)
        calls.append(spans)
    return calls


def _weight_versions(
    samples: list[dict[str, Any]], path: Path, plain: Plain
) -> tuple[list[list[str] | None], list[list[list[dict[str, Any]]] | None]]:
    """Each sample's weight versions in its form: strings (miles before PR #1891: the
    `weight_versions` column) or per-call spans (since: `weight_version_spans`), told
    apart as miles' `Sample.from_dict` does, by the first entry. `legacy_weight_versions`
    (what miles since #1892 keeps of an old dump's strings) is no field at either commit:
    not carried, as miles hands its trainer none of it."""
    strings: list[list[str] | None] = []
    spans: list[list[list[dict[str, Any]]] | None] = []
    for position, sample in enumerate(samples):
        raw = plain(sample.get(c.WEIGHT_VERSIONS))
        if raw is not None and type(raw) not in LISTS:
            reason = f"a {type(raw).__name__} where a list of versions belongs"
            raise field_error(path, c.WEIGHT_VERSIONS, None, position, raw, reason)
        if not raw:  # None or empty: miles' sample without versions
            strings.append(None)
            spans.append(None)
            continue
        plain.budget.charge(len(raw), f"field {c.WEIGHT_VERSIONS} of sample {position}")
        if type(raw[0]) not in LISTS:  # the string form (miles: `isinstance(raw[0], str)`)
            odd = next((v for v in raw if type(v) is not str), _NOT_FOUND)
            if odd is not _NOT_FOUND:
                reason = f"version {preview(odd)} is a {type(odd).__name__}, not a string"
                raise field_error(path, c.WEIGHT_VERSIONS, None, position, raw, reason)
            plain.budget.charge(
                sum(map(len, raw)), f"field {c.WEIGHT_VERSIONS} of sample {position}"
            )
            strings.append(list(raw))
            spans.append(None)
            continue
        calls = _calls(raw, position, plain)
        if isinstance(calls, str):
            raise field_error(path, c.WEIGHT_VERSIONS, None, position, raw, calls)
        strings.append(None)
        spans.append(calls)
    # in a step with versions, a sample without is miles' empty list
    return _empty_lists(strings), _empty_lists(spans)


def _empty_lists(column: list[Any]) -> list[Any]:
    return [[] if v is None else v for v in column] if any(column) else column


_NOT_FOUND = object()


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


def _payload_step(payload: dict[str, Any], path: Path, named: int | None) -> int:
    raw = plain_value(payload.get("rollout_id"))
    if raw is None:
        if named is None:
            raise Malformed("no rollout_id in the dump and no step in its name")
        return named
    if named is not None and named != raw:
        raise step_error(
            "step_mismatch",
            f"{path}: the file is named for step {named} but holds rollout_id {raw}",
            step=raw,
        )
    return int(raw)


def _field(samples: Iterable[dict[str, Any]], key: str, plain: Plain) -> list[Any]:
    return [plain(sample.get(key)) for sample in samples]


class MilesFormat(DumpFormat):
    """miles' and slime's `save_debug_rollout_data` dumps."""

    name = "miles"
    suffixes = (DUMP_SUFFIX,)
    what = WHAT
    holds = "plain values, tensors and numeric numpy arrays"

    def is_dump(self, path: Path) -> bool:
        return is_miles_dump(path)

    def find(
        self, path: Path, refused: list[Violation] | None = None
    ) -> tuple[dict[int, Path], list[str]]:
        return find_miles_dumps(path, refused)

    def unpickle(self, path: Path) -> Any:
        return read_torch_save(path)

    def step_of(self, payload: Any, path: Path, step: int | None) -> int | None:
        d.check(payload, {}, WHAT)  # a dict
        rollout_id = plain_value(payload.get("rollout_id"))  # a 0-d tensor is a number too
        d.check({"rollout_id": rollout_id}, {"rollout_id": DECLARED["rollout_id"]}, WHAT)
        return _payload_step(payload, path, step)

    def rows(
        self, payload: Any, path: Path, step: int | None, options: dict[str, Any]
    ) -> pl.DataFrame:
        assert step is not None, "step_of gives every dump a step"
        d.check(payload, DECLARED, WHAT)
        return _samples_frame(payload["samples"], step, path, options.get("session_version"))


FORMAT = MilesFormat()


def read_miles_dump(path: Path, session_version: str | None = None) -> pl.DataFrame:
    """One row per sample of a miles dump, with CONTRACT section 1 names and types.

    `session_version` ("v1" or "v2") labels every row; otherwise rows with
    `metadata["leaf"]` are v2, rows with the v1 session keys are v1, the rest null.
    Optional columns appear only when some sample has a value.
    """
    if session_version not in (None, "v1", "v2"):
        raise UsageError(f"session_version must be v1 or v2, not {session_version!r}")
    path = Path(path)
    return read_dump(FORMAT, path, named_step(path), session_version=session_version)


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
    weight_versions, weight_version_spans = _weight_versions(samples, path, plain)
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
        c.WEIGHT_VERSIONS: weight_versions,
        c.WEIGHT_VERSION_SPANS: weight_version_spans,
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
        # the spans were checked and rebuilt by `_calls`
        pl.Series(name, column, types[name])
        if name == c.WEIGHT_VERSION_SPANS
        else column_series(name, column, types[name], path, budget)
        for name, column in values.items()
        if name in ALWAYS_PRESENT or any(v is not None for v in column)
    ]
    return pl.DataFrame(series)
