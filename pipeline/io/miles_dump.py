"""Import miles' own rollout dumps (`--dump-details D` -> `D/rollout_data/<step>.pt`).

miles writes each file with `torch.save(dict(rollout_id=<step>, metadata=<trim metadata>,
samples=[Sample.to_dict(), ...]))` (radixark/miles `miles/ray/rollout/debug_data.py`,
`save_debug_rollout_data`; slime writes the same minus `metadata`). Evaluation rollouts go
to `eval_<step>.pt` next to them, and `D/dashboard_columns/` mirrors a few columns as
Parquet; neither is training data.

Loading never runs code from the file and does not need torch: the zip archive is opened
with `zipfile` and its pickle read by a restricted `pickle.Unpickler` that allows what
`torch.load(weights_only=True)` allows for this data (tensors, rebuilt as numpy arrays from
the archive's storages; numeric numpy arrays and scalars, since routing-replay dumps carry
`rollout_routed_experts` as int32 arrays; `OrderedDict`; plain builtins). Anything else is
refused. torch is not used even when installed, so shards do not depend on it.

The session version is not stored. v2 leaves carry `metadata["leaf"]` (a descriptor
`{node_id, parent, path_node_ids, response_id}`, miles `session/v2/assembly.py`); the
single v1 sample gets the session server's TITO bookkeeping merged into its metadata
(`accumulated_token_ids`, `max_trim_tokens`, `tito_session_mismatch`;
`generate_hub/agentic_tool_call.py`). Those v1 keys differ across miles versions and
forks, so `session_version=` is the reliable way to label a dump.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import polars as pl

from pipeline import columns as c
from pipeline.errors import StepError, UsageError, step_error

ROLLOUT_DATA = "rollout_data"
DUMP_SUFFIX = ".pt"
V1_SESSION_KEYS = ("accumulated_token_ids", "max_trim_tokens", "tito_session_mismatch")
LEAF_KEY = "leaf"
LEGACY_WEIGHT_VERSIONS_KEY = "legacy_weight_versions"

# `--save-debug-rollout-data` is a template, so besides `<step>.pt` accept a prefix
# ending in `_`, `-` or `=` (`rollout_12.pt`); eval dumps put `eval_` before the step.
_EVAL_STEM = re.compile(r"^(?:.*[_=-])?eval_(\d+)$")
_STEP_STEM = re.compile(r"^(?:.*[_=-])?(\d+)$")

ALWAYS_PRESENT = frozenset(
    (c.STEP, c.INDEX, c.LEAF, c.STATUS, c.TOKENS, c.RESPONSE_LENGTH, c.REWARD, c.REMOVE_SAMPLE)
)


def _eval_step(path: Path) -> int | None:
    match = _EVAL_STEM.match(path.stem)
    return int(match.group(1)) if match else None


def _named_step(path: Path) -> int | None:
    match = _STEP_STEM.match(path.stem)
    return int(match.group(1)) if match and _eval_step(path) is None else None


def _dump_files(folder: Path) -> list[Path]:
    return sorted(
        (
            p
            for p in folder.iterdir()
            if p.is_file() and p.suffix == DUMP_SUFFIX and not p.name.startswith(".")
        ),
        key=lambda p: p.name,
    )


def is_miles_dump(path: Path) -> bool:
    """A `.pt` file, a `rollout_data` folder, or a `--dump-details` folder with dumps."""
    path = Path(path)
    if path.is_file():
        return path.suffix == DUMP_SUFFIX
    if not path.is_dir():
        return False
    if path.name == ROLLOUT_DATA:
        return True
    rollout_data = path / ROLLOUT_DATA
    return rollout_data.is_dir() and bool(_dump_files(rollout_data))


def find_miles_dumps(path: Path) -> tuple[dict[int, Path], list[str]]:
    """Step -> dump file under a `--dump-details` folder, a `rollout_data` folder or one file.

    Returns the steps in ascending order and notes on what was skipped (eval dumps, files
    not named for a step, sibling folders of `rollout_data`).
    """
    path = Path(path)
    notes: list[str] = []
    if path.is_file():
        if path.suffix != DUMP_SUFFIX:
            raise UsageError(f"input {path} is not a miles dump (expected <step>{DUMP_SUFFIX})")
        candidates = [path]
    elif path.is_dir():
        folder = path
        if path.name != ROLLOUT_DATA and (path / ROLLOUT_DATA).is_dir():
            folder = path / ROLLOUT_DATA
            ignored = sorted(
                p.name + "/" for p in path.iterdir() if p.is_dir() and p.name != ROLLOUT_DATA
            )
            if ignored:
                notes.append(
                    f"ignored {', '.join(ignored)} in {path} (only {ROLLOUT_DATA}/ is read)"
                )
        candidates = _dump_files(folder)
        if not candidates:
            notes.append(f"no <step>{DUMP_SUFFIX} files in {folder}")
    else:
        raise UsageError(f"input {path} does not exist")

    found: dict[int, Path] = {}
    for file in candidates:
        if _eval_step(file) is not None:
            notes.append(f"skipped eval dump {file.name}")
            continue
        step = _named_step(file)
        if step is None:
            if file == path:
                raise UsageError(
                    f"cannot tell the step of {file}: miles names dumps <step>{DUMP_SUFFIX}"
                )
            notes.append(f"skipped {file.name}: not named <step>{DUMP_SUFFIX}")
            continue
        if step in found:
            raise step_error(
                "duplicate_step",
                f"{found[step]} and {file} are both dumps of step {step}; keep one",
                step=step,
            )
        found[step] = file
    return dict(sorted(found.items())), notes


class _Refused(Exception):
    """The file asks for something outside the allowlist; nothing from it has run."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _Unreadable(Exception):
    """The file is not a torch.save archive this reader understands."""


# torch.save writes pickle protocol 2, so the builtins come as `__builtin__` names.
_BUILTIN_MODULES = ("builtins", "__builtin__")
_BUILTINS = {"set": set, "frozenset": frozenset, "complex": complex, "bytearray": bytearray}
_NUMERIC_KINDS = frozenset("biufc")  # bool, int, uint, float, complex

# torch's typed storage classes -> numpy dtype (without byte order).
_STORAGE_DTYPES = {
    "DoubleStorage": "f8",
    "FloatStorage": "f4",
    "HalfStorage": "f2",
    "BFloat16Storage": "bf16",
    "LongStorage": "i8",
    "IntStorage": "i4",
    "ShortStorage": "i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
    "ComplexFloatStorage": "c8",
    "ComplexDoubleStorage": "c16",
}

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
LEGACY_FORMAT = (
    "written in torch's legacy (pre-1.6, non-zip) torch.save format, which is read only "
    "with torch; re-save it with a current torch.save"
)


class _StorageType:
    def __init__(self, name: str) -> None:
        self.name = name


def _encode(text: str, encoding: str = "latin1") -> bytes:
    """`_codecs.encode` as protocol 2 uses it for bytes, and only that."""
    if encoding != "latin1" or not isinstance(text, str):
        raise _Refused(f"_codecs.encode with {encoding!r}")
    return text.encode("latin1")


def _checked_dtype(dtype: Any) -> Any:
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype.kind not in _NUMERIC_KINDS or dtype.hasobject or dtype.fields:
        raise _Refused(f"numpy arrays of dtype {dtype} (only numeric arrays are read)")
    return dtype


def _numpy_dtype(*args: Any) -> Any:
    import numpy as np

    return _checked_dtype(np.dtype(*args))


def _numpy_reconstruct(cls: Any, shape: Any, dtype_code: Any) -> Any:
    import numpy as np

    if cls is not np.ndarray:
        raise _Refused(f"numpy _reconstruct of {cls!r}")
    return np.ndarray.__new__(np.ndarray, shape, dtype_code)


def _numpy_scalar(dtype: Any, data: Any = None) -> Any:
    import numpy as np

    dtype = _checked_dtype(dtype)
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise _Unreadable(f"a numpy {dtype} scalar without its {dtype.itemsize} bytes")
    return np.frombuffer(data, dtype=dtype)[0]


def _numpy_globals() -> dict[tuple[str, str], Any]:
    import numpy as np

    found: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray}
    found[("numpy", "dtype")] = _numpy_dtype
    # numpy 2 writes `numpy._core`, numpy 1.x `numpy.core`.
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        found[(module, "_reconstruct")] = _numpy_reconstruct
        found[(module, "scalar")] = _numpy_scalar
    for code in "?bhilqBHILQefdgFDG":
        kind = type(np.dtype(code))
        found[("numpy.dtypes", kind.__name__)] = kind
    return found


class _DumpUnpickler(pickle.Unpickler):
    """Rebuilds only plain values, tensors (as numpy arrays) and numeric numpy arrays."""

    def __init__(self, file: Any, storages: Any = None, byteorder: Literal["<", ">"] = "<") -> None:
        super().__init__(file)
        self._storages = storages
        self._byteorder = byteorder
        self._loaded: dict[str, Any] = {}
        self._numpy = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        if module in _BUILTIN_MODULES and name in _BUILTINS:
            return _BUILTINS[name]
        if (module, name) == ("collections", "OrderedDict"):
            from collections import OrderedDict

            return OrderedDict
        if (module, name) == ("_codecs", "encode"):
            return _encode
        if self._storages is not None:
            if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return self._rebuild_tensor
            if module == "torch" and name in _STORAGE_DTYPES:
                return _StorageType(name)
        if (module, name) in self._numpy:
            return self._numpy[(module, name)]
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if self._storages is None:
            raise _Refused("a persistent id (a tensor storage outside a torch.save archive)")
        if (
            not isinstance(pid, tuple)
            or len(pid) < 5
            or pid[0] != "storage"
            or not isinstance(pid[1], _StorageType)
        ):
            raise _Refused(f"storage {pid!r:.80}")
        storage_type, key, numel = pid[1], str(pid[2]), pid[4]
        if key not in self._loaded:
            self._loaded[key] = self._storage(storage_type.name, key, numel)
        return self._loaded[key]

    def _storage(self, storage_name: str, key: str, numel: Any) -> Any:
        import numpy as np

        try:
            data = self._storages(key)
        except KeyError:
            raise _Unreadable(f"storage data/{key} is missing from the archive") from None
        code = _STORAGE_DTYPES[storage_name]
        if code == "bf16":  # numpy has no bfloat16: widen to float32, which holds it exactly
            raw = np.frombuffer(data, dtype=np.dtype(self._byteorder + "u2"))
            array = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(data, dtype=np.dtype(code).newbyteorder(self._byteorder))
        if not isinstance(numel, int) or array.size != numel:
            raise _Unreadable(f"storage data/{key} holds {array.size} elements, not {numel}")
        return array

    def _rebuild_tensor(
        self, storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any
    ) -> Any:
        import numpy as np

        shape, steps = tuple(size), tuple(stride)
        if (
            not isinstance(storage, np.ndarray)
            or not isinstance(offset, int)
            or len(shape) != len(steps)
            or not all(isinstance(n, int) and n >= 0 for n in shape + steps + (offset,))
        ):
            raise _Unreadable("a tensor with malformed rebuild arguments")
        if 0 in shape:
            return np.empty(shape, dtype=storage.dtype.newbyteorder("="))
        last = offset + sum((n - 1) * s for n, s in zip(shape, steps, strict=True))
        if last >= storage.size:
            raise _Unreadable("a tensor reaching past the end of its storage")
        view = np.lib.stride_tricks.as_strided(
            storage[offset:],
            shape=shape,
            strides=tuple(s * storage.itemsize for s in steps),
            writeable=False,
        )
        return np.array(view, dtype=storage.dtype.newbyteorder("="))


def _check_arrays(value: Any) -> None:
    """numpy's own `__setstate__` may have set a non-numeric dtype: refuse those too."""
    import numpy as np

    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if id(item) in seen:  # a pickle may hold a list that contains itself
            continue
        seen.add(id(item))
        if isinstance(item, np.ndarray):
            _checked_dtype(item.dtype)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)


def _read_torch_save(path: Path) -> Any:
    """A torch.save file read with the standard library and numpy; tensors become arrays."""
    with open(path, "rb") as file:
        head = file.read(4)
    if head == b"PK\x03\x04":
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise _Unreadable("a zip file without one <archive>/data.pkl")
            prefix = pickles[0].removesuffix("data.pkl")
            names = set(archive.namelist())
            order = "little"
            if prefix + "byteorder" in names:
                order = archive.read(prefix + "byteorder").decode("ascii", "replace").strip()
            if order not in ("little", "big"):
                raise _Unreadable(f"unknown byte order {order!r:.20}")
            with archive.open(pickles[0]) as data:
                unpickler = _DumpUnpickler(
                    data,
                    storages=lambda key: archive.read(f"{prefix}data/{key}"),
                    byteorder="<" if order == "little" else ">",
                )
                value = unpickler.load()
    else:
        with open(path, "rb") as file:
            value = _DumpUnpickler(file).load()
            if type(value) is int and value == _LEGACY_MAGIC:
                raise _Unreadable(LEGACY_FORMAT)
        raise _Unreadable("a plain pickle, not a torch.save file")
    _check_arrays(value)
    return value


def _load_payload(path: Path) -> Any:
    """Never runs code from the file: only allowlisted names are looked up (see
    `_DumpUnpickler`), and torch is not needed, so shards do not depend on it."""
    try:
        return _read_torch_save(path)
    except _Refused as refused:
        raise step_error(
            "unsafe_pickle",
            f"{path}: refused to unpickle: it needs {refused.name}; a miles dump holds only "
            "plain values, tensors and numeric numpy arrays, and loading anything else "
            "could run code from the file",
        ) from None
    except _Unreadable as exc:
        raise step_error(
            "unreadable_file", f"{path}: not a readable torch.save file: {exc}"
        ) from None
    except Exception as exc:  # a damaged file fails in many ways
        raise _unreadable(path, exc) from None


def _unreadable(path: Path, exc: BaseException) -> StepError:
    return step_error(
        "unreadable_file",
        f"{path}: not a readable torch.save file, truncated or corrupt? ({_first_line(exc)})",
    )


def _first_line(exc: BaseException) -> str:
    """The exception's first sentence: torch appends paragraphs of advice."""
    text = str(exc).strip()
    first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _plain(value: Any) -> Any:
    """Tensors, numpy arrays and numpy scalars as Python lists and numbers."""
    if value is not None and not isinstance(value, (str, bytes)) and hasattr(value, "tolist"):
        return value.tolist()
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return repr(value)


def _json(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, default=_json_default, ensure_ascii=False)


def _status(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    return text.removeprefix("status.")


def _flag(value: Any) -> Any:
    if value is None:
        return False
    value = _plain(value)
    return bool(value) if isinstance(value, int) else value


def _weight_versions(sample: dict[str, Any]) -> list[str]:
    """Versions in call order: legacy dumps hold strings, current ones per-call span lists."""
    raw = (
        _plain(sample.get(c.WEIGHT_VERSIONS))
        or _plain(sample.get(LEGACY_WEIGHT_VERSIONS_KEY))
        or []
    )
    versions: list[str] = []
    for call in raw:
        spans = call if isinstance(call, list) else [call]
        for span in spans:
            version = span.get("version") if isinstance(span, dict) else span
            if version is not None:
                versions.append(str(version))
    return versions


def _session_version(metadata: dict[str, Any]) -> str | None:
    if LEAF_KEY in metadata:
        return "v2"
    if any(key in metadata for key in V1_SESSION_KEYS):
        return "v1"
    return None


def _reward_values(rewards: list[Any], path: Path) -> tuple[list[Any], pl.DataType]:
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
    named = [None if r is None else {str(k): _plain(v) for k, v in r.items()} for r in rewards]
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


def _series(name: str, values: list[Any], dtype: pl.DataType, path: Path) -> pl.Series:
    try:
        return pl.Series(name, values, dtype=dtype, strict=True)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError) as exc:
        bad = next((i for i, v in enumerate(values) if not _fits(name, v, dtype)), None)
        where = f" on sample {bad} ({values[bad]!r:.80})" if bad is not None else ""
        raise step_error(
            "malformed_dump",
            f"{path}: field {name} does not fit {dtype}{where}: {_first_line(exc)}",
        ) from None


def _fits(name: str, value: Any, dtype: pl.DataType) -> bool:
    try:
        pl.Series(name, [value], dtype=dtype, strict=True)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return False
    return True


def _payload_step(payload: dict[str, Any], path: Path) -> int:
    named = _named_step(path)
    raw = _plain(payload.get("rollout_id"))
    if raw is None:
        if named is None:
            raise step_error(
                "malformed_dump", f"{path}: no rollout_id in the dump and no step in its name"
            )
        return named
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise step_error("malformed_dump", f"{path}: rollout_id {raw!r} is not a step number")
    if named is not None and named != raw:
        raise step_error(
            "step_mismatch",
            f"{path}: the file is named for step {named} but holds rollout_id {raw}",
            step=raw,
        )
    return raw


def _field(samples: Iterable[dict[str, Any]], key: str) -> list[Any]:
    return [_plain(sample.get(key)) for sample in samples]


def read_miles_dump(path: Path, session_version: str | None = None) -> pl.DataFrame:
    """One row per sample of a miles dump, with CONTRACT section 1 names and types.

    `session_version` ("v1" or "v2") labels every row; otherwise rows with
    `metadata["leaf"]` are v2, rows with the v1 session keys are v1, the rest null.
    Optional columns appear only when some sample has a value.
    """
    if session_version not in (None, "v1", "v2"):
        raise UsageError(f"session_version must be v1 or v2, not {session_version!r}")
    path = Path(path)
    payload = _load_payload(path)
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


def _samples_frame(
    samples: list[dict[str, Any]], step: int, path: Path, session_version: str | None
) -> pl.DataFrame:
    metadata = [sample.get(c.METADATA) or {} for sample in samples]
    for position, meta in enumerate(metadata):
        if not isinstance(meta, dict):
            raise step_error(
                "malformed_dump", f"{path}: metadata of sample {position} is not a dict"
            )

    leaves: list[int] = []
    seen: dict[Any, int] = {}
    for position, (sample, meta) in enumerate(zip(samples, metadata, strict=True)):
        index = _plain(sample.get(c.INDEX))
        # An index that is not a number (a list, a dict) is refused by the index column
        # below; here it only must not count as a leaf of another sample.
        key = index if isinstance(index, (int, float, str, type(None))) else ("sample", position)
        order = seen.get(key, 0)
        seen[key] = order + 1
        leaf = _plain(meta.get(LEAF_KEY))
        # Real v2 leaves carry a descriptor dict; only a bare number is a position.
        leaves.append(leaf if isinstance(leaf, int) and not isinstance(leaf, bool) else order)

    versions = (
        [session_version] * len(samples)
        if session_version is not None
        else [_session_version(meta) for meta in metadata]
    )
    weight_versions = [_weight_versions(s) for s in samples]
    rewards, reward_dtype = _reward_values(_field(samples, c.REWARD), path)

    columns: list[tuple[str, list[Any], pl.DataType]] = [
        (c.STEP, [step] * len(samples), pl.Int64()),
        (c.GROUP_INDEX, _field(samples, c.GROUP_INDEX), pl.Int64()),
        (c.INDEX, _field(samples, c.INDEX), pl.Int64()),
        (c.LEAF, leaves, pl.Int32()),
        (c.ROLLOUT_ID, _field(samples, c.ROLLOUT_ID), pl.Int64()),
        (c.SESSION_VERSION, versions, pl.String()),
        (c.STATUS, [_status(s.get(c.STATUS)) for s in samples], pl.String()),
        (c.TOKENS, _field(samples, c.TOKENS), pl.List(pl.Int32())),
        (c.RESPONSE_LENGTH, _field(samples, c.RESPONSE_LENGTH), pl.Int32()),
        (c.LOSS_MASK, _field(samples, c.LOSS_MASK), pl.List(pl.Int8())),
        (c.REWARD, rewards, reward_dtype),
        (c.REMOVE_SAMPLE, [_flag(s.get(c.REMOVE_SAMPLE)) for s in samples], pl.Boolean()),
        (c.ROLLOUT_LOG_PROBS, _field(samples, c.ROLLOUT_LOG_PROBS), pl.List(pl.Float32())),
        (c.TEACHER_LOG_PROBS, _field(samples, c.TEACHER_LOG_PROBS), pl.List(pl.Float32())),
        (
            c.WEIGHT_VERSIONS,
            weight_versions if any(weight_versions) else [None] * len(samples),
            pl.List(pl.String()),
        ),
        (c.RAW_REWARD, [_plain(m.get(c.RAW_REWARD)) for m in metadata], pl.Float64()),
        (c.ROUND_NUMBER, [_plain(m.get(c.ROUND_NUMBER)) for m in metadata], pl.Int64()),
        (c.TRAIN_METADATA, [_json(s.get(c.TRAIN_METADATA)) for s in samples], pl.String()),
        (c.PROMPT, [_json(s.get(c.PROMPT)) for s in samples], pl.String()),
        (c.METADATA, [_json(s.get(c.METADATA)) for s in samples], pl.String()),
    ]
    series = [
        _series(name, values, dtype, path)
        for name, values, dtype in columns
        if name in ALWAYS_PRESENT or any(v is not None for v in values)
    ]
    return pl.DataFrame(series)
