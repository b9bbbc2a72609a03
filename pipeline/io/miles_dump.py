"""Import miles' own rollout dumps: one row per sample, with CONTRACT section 1 columns.

miles writes each file with `torch.save(dict(rollout_id=<step>, metadata=<trim metadata>,
samples=[Sample.to_dict(), ...]))` (radixark/miles `miles/ray/rollout/debug_data.py`,
`save_debug_rollout_data`; slime writes the same minus `metadata`). Finding the files is
`pipeline.io.dump_files`; unpickling them safely is `pipeline.io.dump_pickle`; this module
maps the samples to columns.

The session version is not stored. v2 leaves carry `metadata["leaf"]` (a descriptor
`{node_id, parent, path_node_ids, response_id}`, miles `session/v2/assembly.py`); the
single v1 sample gets the session server's TITO bookkeeping merged into its metadata
(`accumulated_token_ids`, `max_trim_tokens`, `tito_session_mismatch`;
`generate_hub/agentic_tool_call.py`). Those v1 keys differ across miles versions and
forks, so `session_version=` is the reliable way to label a dump.

The unpickled values are Python objects the file chose: before any reaches Polars (which
recurses into nested values without a limit) or `json`, its shape is checked, cycles are
refused, and what the columns would hold is charged to a budget bounded by the file's size
(a pickle can reference one list from every sample).
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Iterable
from itertools import chain
from pathlib import Path
from typing import Any

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, UsageError, step_error
from pipeline.io.dump_files import find_miles_dumps, is_miles_dump, named_step
from pipeline.io.dump_pickle import (
    VALUES_PER_BYTE,
    Budget,
    TooBig,
    first_sentence,
    load_payload,
)

__all__ = ["find_miles_dumps", "is_miles_dump", "read_miles_dump"]

V1_SESSION_KEYS = ("accumulated_token_ids", "max_trim_tokens", "tito_session_mismatch")
LEAF_KEY = "leaf"
LEGACY_WEIGHT_VERSIONS_KEY = "legacy_weight_versions"

ALWAYS_PRESENT = frozenset(
    (c.STEP, c.INDEX, c.LEAF, c.STATUS, c.TOKENS, c.RESPONSE_LENGTH, c.REWARD, c.REMOVE_SAMPLE)
)

_NONE = type(None)
_LISTS = (list, tuple)
# Values Polars takes without looking inside; numpy scalars are leaves too.
_LEAVES = frozenset((int, float, bool, str, _NONE))
_NUMBERS = frozenset((int, float, bool, _NONE))

_PREVIEW = reprlib.Repr()
_PREVIEW.maxlevel = 3
_PREVIEW.maxlist = _PREVIEW.maxtuple = 8
_PREVIEW.maxdict = _PREVIEW.maxset = _PREVIEW.maxfrozenset = 4
_PREVIEW.maxstring = _PREVIEW.maxother = 60


class _Malformed(Exception):
    """A sample's field that cannot become its column."""


def _preview(value: Any) -> str:
    """A short repr that stops at nesting and cycles."""
    text = _PREVIEW.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_leaf(kind: type, numeric: bool = False) -> bool:
    """A value Polars takes without looking inside. Where a number belongs a bool is not
    one: Polars would read True as 1."""
    if kind in _LEAVES:
        return not (numeric and kind is bool)
    import numpy as np

    if issubclass(kind, np.bool_):
        return not numeric
    return issubclass(kind, np.number)


def _what_belongs(numeric: bool) -> str:
    return "a number" if numeric else "a single value"


def _plain(value: Any) -> Any:
    """Tensors, numpy arrays and numpy scalars as Python lists and numbers."""
    if value is not None and not isinstance(value, (str, bytes)) and hasattr(value, "tolist"):
        return value.tolist()
    return value


class _Plain:
    """`_plain` for the samples' fields: an array shared by many samples becomes one list
    (the pickle stored it once), and the values it makes are charged to the budget."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.made: dict[int, Any] = {}

    def __call__(self, value: Any) -> Any:
        if value is None or isinstance(value, (str, bytes)) or not hasattr(value, "tolist"):
            return value
        made = self.made.get(id(value))
        if made is None:
            size = getattr(value, "size", 1)
            self.budget.charge(size if isinstance(size, int) else 1, "an array's values")
            made = self.made[id(value)] = value.tolist()
        return made


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return repr(value)


class _Sizes:
    """How many values a field expands to once written out, with the sizes of shared
    containers remembered, so that a pickle referencing one list from many places is
    measured without being walked again; a container inside itself is a cycle."""

    _OPEN = -1

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.sizes: dict[int, int] = {}

    @staticmethod
    def _children(node: Any) -> Iterable[Any]:
        if isinstance(node, dict):
            return chain(node.keys(), node.values())
        return node  # type: ignore[no-any-return]

    @staticmethod
    def _leaf_size(value: Any) -> int:
        if isinstance(value, str | bytes | bytearray):
            return len(value) + 1
        size = getattr(value, "size", None)
        return size + 1 if isinstance(size, int) else 1

    @staticmethod
    def _container(value: Any) -> bool:
        return isinstance(value, list | tuple | dict | set | frozenset)

    def size(self, root: Any, what: str) -> int:
        if not self._container(root):
            return self._leaf_size(root)
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            node, done = stack.pop()
            key = id(node)
            if done:
                total = 1 + sum(
                    self.sizes[id(child)] if self._container(child) else self._leaf_size(child)
                    for child in self._children(node)
                )
                if total > self.budget.left:
                    self.budget.charge(total, what)
                self.sizes[key] = total
                continue
            if key in self.sizes:
                continue
            if type(node) in _LISTS and set(map(type, node)) <= _NUMBERS:
                self.sizes[key] = 1 + len(node)
                continue
            self.sizes[key] = self._OPEN
            stack.append((node, True))
            for child in self._children(node):
                if self._container(child):
                    state = self.sizes.get(id(child))
                    if state == self._OPEN:
                        raise _Malformed("refers to itself (a cycle)")
                    if state is None:
                        stack.append((child, False))
        return self.sizes[id(root)]


def _json(value: Any, sizes: _Sizes, what: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    sizes.budget.charge(sizes.size(value, what), what)
    try:
        return json.dumps(value, default=_json_default, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise _Malformed(f"is not JSON text ({first_sentence(exc)})") from None


def _json_field(
    samples: list[dict[str, Any]], key: str, sizes: _Sizes, path: Path
) -> list[str | None]:
    values = []
    for position, sample in enumerate(samples):
        value = sample.get(key)
        try:
            values.append(_json(value, sizes, f"field {key} of sample {position}"))
        except _Malformed as exc:
            raise _field_error(path, key, None, position, value, str(exc)) from None
    return values


def _field_error(
    path: Path, name: str, dtype: pl.DataType | None, position: int, value: Any, reason: str
) -> StepError:
    fits = f" does not fit {dtype}" if dtype is not None else ""
    return step_error(
        "malformed_dump",
        f"{path}: field {name}{fits} on sample {position} ({_preview(value)}): {reason}",
    )


def _status(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    return text.removeprefix("status.")


def _flag(value: Any, plain: _Plain) -> Any:
    """miles' `remove_sample` is a bool (False when absent); anything else is refused by
    its Boolean column, never read as true or false."""
    return False if value is None else plain(value)


def _weight_versions(samples: list[dict[str, Any]], path: Path, plain: _Plain) -> list[list[str]]:
    """Versions in call order: legacy dumps hold strings, current ones per-call span lists."""
    budget = plain.budget
    found: list[list[str]] = []
    for position, sample in enumerate(samples):
        raw = plain(sample.get(c.WEIGHT_VERSIONS))
        if raw is None or (type(raw) in _LISTS and not raw):
            legacy = plain(sample.get(LEGACY_WEIGHT_VERSIONS_KEY))
            raw = raw if legacy is None else legacy
        if raw is None:
            found.append([])
            continue
        if type(raw) not in _LISTS:
            reason = f"a {type(raw).__name__} where a list of versions belongs"
            raise _field_error(path, c.WEIGHT_VERSIONS, None, position, raw, reason)
        budget.charge(len(raw), f"field {c.WEIGHT_VERSIONS} of sample {position}")
        versions: list[str] = []
        for call in raw:
            spans = call if type(call) in _LISTS else (call,)
            budget.charge(len(spans), f"field {c.WEIGHT_VERSIONS} of sample {position}")
            for span in spans:
                version = span.get("version") if isinstance(span, dict) else span
                if version is None:
                    continue
                if type(version) is not str:
                    kind = type(version).__name__
                    reason = f"version {_preview(version)} is a {kind}, not a string"
                    raise _field_error(path, c.WEIGHT_VERSIONS, None, position, raw, reason)
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


def _reward_values(rewards: list[Any], path: Path, plain: _Plain) -> tuple[list[Any], pl.DataType]:
    """Scalars as float64; dicts as a struct of their numeric fields."""
    dicts = [i for i, r in enumerate(rewards) if isinstance(r, dict)]
    if not dicts:
        return rewards, pl.Float64()
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
    return values, pl.Struct({key: pl.Float64() for key in numeric})


def _list_problem(values: list[Any], numeric: bool) -> tuple[int, str] | None:
    """The first sample whose value is not a flat list (Polars would recurse into it)."""
    if set(map(type, values)) <= {list, tuple, _NONE}:
        inner = set(map(type, chain.from_iterable(filter(None, values))))
        if all(_is_leaf(kind, numeric) for kind in inner):
            return None
    for position, value in enumerate(values):
        if value is None:
            continue
        if type(value) not in _LISTS:
            return position, f"a {type(value).__name__} where a list belongs"
        for at, element in enumerate(value):
            if element is value:
                return position, f"element {at} is the list itself (a cycle)"
            if not _is_leaf(type(element), numeric):
                kind = type(element).__name__
                return position, f"element {at} is a {kind}, not {_what_belongs(numeric)}"
    return None


def _scalar_problem(values: list[Any], numeric: bool) -> tuple[int, str] | None:
    if all(_is_leaf(kind, numeric) for kind in set(map(type, values))):
        return None
    for position, value in enumerate(values):
        if not _is_leaf(type(value), numeric):
            kind = type(value).__name__
            return position, f"a {kind} where {_what_belongs(numeric)} belongs"
    return None


def _series(
    name: str, values: list[Any], dtype: pl.DataType, path: Path, budget: Budget
) -> pl.Series:
    if isinstance(dtype, pl.List):
        problem = _list_problem(values, dtype.inner.is_numeric())
        if problem is None:
            budget.charge(sum(map(len, filter(None, values))), f"field {name}")
    elif isinstance(dtype, pl.Struct):
        problem = None  # built by `_reward_values` from numbers only
    else:
        problem = _scalar_problem(values, dtype.is_numeric())
        if problem is None and isinstance(dtype, pl.String):
            budget.charge(sum(len(v) for v in values if type(v) is str), f"field {name}")
    if problem is not None:
        position, reason = problem
        raise _field_error(path, name, dtype, position, values[position], reason)
    try:
        return pl.Series(name, values, dtype=dtype, strict=True)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError) as exc:
        bad = next((i for i, v in enumerate(values) if not _fits(name, v, dtype)), None)
        where = f" on sample {bad} ({_preview(values[bad])})" if bad is not None else ""
        raise step_error(
            "malformed_dump",
            f"{path}: field {name} does not fit {dtype}{where}: {first_sentence(exc)}",
        ) from None


def _fits(name: str, value: Any, dtype: pl.DataType) -> bool:
    try:
        pl.Series(name, [value], dtype=dtype, strict=True)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return False
    return True


def _payload_step(payload: dict[str, Any], path: Path) -> int:
    named = named_step(path)
    raw = _plain(payload.get("rollout_id"))
    if raw is None:
        if named is None:
            raise step_error(
                "malformed_dump", f"{path}: no rollout_id in the dump and no step in its name"
            )
        return named
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise step_error(
            "malformed_dump", f"{path}: rollout_id {_preview(raw)} is not a step number"
        )
    if named is not None and named != raw:
        raise step_error(
            "step_mismatch",
            f"{path}: the file is named for step {named} but holds rollout_id {raw}",
            step=raw,
        )
    return raw


def _field(samples: Iterable[dict[str, Any]], key: str, plain: _Plain) -> list[Any]:
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
    plain = _Plain(budget)
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
    sizes = _Sizes(budget)

    columns: list[tuple[str, list[Any], pl.DataType]] = [
        (c.STEP, [step] * len(samples), pl.Int64()),
        (c.GROUP_INDEX, _field(samples, c.GROUP_INDEX, plain), pl.Int64()),
        (c.INDEX, _field(samples, c.INDEX, plain), pl.Int64()),
        (c.LEAF, leaves, pl.Int32()),
        (c.ROLLOUT_ID, _field(samples, c.ROLLOUT_ID, plain), pl.Int64()),
        (c.SESSION_VERSION, versions, pl.String()),
        (c.STATUS, [_status(s.get(c.STATUS)) for s in samples], pl.String()),
        (c.TOKENS, _field(samples, c.TOKENS, plain), pl.List(pl.Int32())),
        (c.RESPONSE_LENGTH, _field(samples, c.RESPONSE_LENGTH, plain), pl.Int32()),
        (c.LOSS_MASK, _field(samples, c.LOSS_MASK, plain), pl.List(pl.Int8())),
        (c.REWARD, rewards, reward_dtype),
        (c.REMOVE_SAMPLE, [_flag(s.get(c.REMOVE_SAMPLE), plain) for s in samples], pl.Boolean()),
        (c.ROLLOUT_LOG_PROBS, _field(samples, c.ROLLOUT_LOG_PROBS, plain), pl.List(pl.Float32())),
        (c.TEACHER_LOG_PROBS, _field(samples, c.TEACHER_LOG_PROBS, plain), pl.List(pl.Float32())),
        (
            c.WEIGHT_VERSIONS,
            weight_versions if any(weight_versions) else [None] * len(samples),
            pl.List(pl.String()),
        ),
        (c.RAW_REWARD, [plain(m.get(c.RAW_REWARD)) for m in metadata], pl.Float64()),
        (c.ROUND_NUMBER, [plain(m.get(c.ROUND_NUMBER)) for m in metadata], pl.Int64()),
        (c.TRAIN_METADATA, _json_field(samples, c.TRAIN_METADATA, sizes, path), pl.String()),
        (c.PROMPT, _json_field(samples, c.PROMPT, sizes, path), pl.String()),
        (c.METADATA, _json_field(samples, c.METADATA, sizes, path), pl.String()),
    ]
    held = [name for name in c.NOT_CARRIED if any(s.get(name) is not None for s in samples)]
    if held:
        raise step_error(
            "input_not_carried",
            f"{path}: samples hold {', '.join(held)}, which miles trains on and the shards do "
            "not carry: convert such steps in miles",
            step,
        )
    series = [
        _series(name, values, dtype, path, budget)
        for name, values, dtype in columns
        if name in ALWAYS_PRESENT or any(v is not None for v in values)
    ]
    return pl.DataFrame(series)
