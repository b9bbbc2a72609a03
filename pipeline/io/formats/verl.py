"""verl's own dumps as input: the `DataProto` pickles verl 0.9.1 writes
(`DataProto.save_to_disk`; the rollout skip manager's `<dump folder>/<step>/gen_batch.dp`,
the agent loop's output for one step), read without running code and without torch or verl.

The file is a pickle of a `DataProto` whose state is (the batch as torch.save bytes of a
consolidated TensorDict, the non-tensor batch as numpy arrays, the meta info). A restricted
unpickler (`unpickle`) builds only plain values, numpy arrays (object arrays
of such values too) and an inert record of the DataProto's state; the batch's archive is
read by one that rebuilds tensordict's consolidated leaves from their byte ranges. Anything
else (a multimodal batch's tensors among the non-tensor values, another serialization) is
refused as `unsafe_pickle`.

What is taken is `DECLARED` (`declared.check`: each tensor's dimensions by name and kind
of numbers, the uids one string per row; prompts and responses at least one token wide), so
a batch of another shape is one `malformed_dump` line through the frame every format
shares (`frame.read_dump`). Taken (docs/verl.md): `prompts`, `responses`,
`attention_mask`, `response_mask`, `rm_scores`, `rollout_log_probs` when present, and the
non-tensor `uid` when present. A row becomes one input row: `tokens` the prompt and
response tokens the attention mask keeps, `response_length` the response's, `loss_mask`
the response mask over them, `reward` the score at the last response token, `group_index`
the uid's order of first appearance (without `uid`, runs of one repeated prompt: verl
repeats each prompt n times, interleaved), `status` truncated where the response fills
`max_response_length`, `index` the row.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from pipeline import columns as c
from pipeline.errors import Violation
from pipeline.io.formats import declared as d
from pipeline.io.formats import unpickle as dp
from pipeline.io.formats.frame import DumpFormat, read_dump
from pipeline.io.formats.names import SUFFIX, find_verl_dumps, is_verl_dump

if TYPE_CHECKING:  # numpy is imported by the read: finding dumps, or a table build, needs none
    import numpy as np

WHAT = "a verl DataProto dump"
DECLARED: d.Declared = {
    "prompts": d.Tensor(("rows", "prompt")),
    "responses": d.Tensor(("rows", "response")),
    "attention_mask": d.Tensor(("rows", ("prompt", "response"))),
    "response_mask": d.Tensor(("rows", "response")),
    "rm_scores": d.Tensor(("rows", "response"), kinds="iubf"),
    "rollout_log_probs": d.Tensor(("rows", "response"), kinds="iubf", required=False),
    "uid": d.Texts("rows", required=False),
}
NONZERO = ("prompt", "response")  # zero rows read as zero rows, as a table's do
# tensordict's dtype names -> numpy codes (bfloat16 widened to float32)
_DTYPES = {
    "torch.int64": "i8",
    "torch.int32": "i4",
    "torch.int16": "i2",
    "torch.int8": "i1",
    "torch.uint8": "u1",
    "torch.bool": "?",
    "torch.float64": "f8",
    "torch.float32": "f4",
    "torch.float16": "f2",
    "torch.bfloat16": "bf16",
}
INT32_MAX = 2**31 - 1


class _DataProtoState:
    """What a pickled `verl.protocol.DataProto` holds, kept as data: no verl code runs."""

    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _any_dtype(*args: Any) -> Any:
    import numpy as np

    dtype = np.dtype(*args)
    return dtype if dtype.kind == "O" else dp.checked_dtype(dtype)


class _OuterUnpickler(dp.DumpUnpickler):
    """The DataProto and its non-tensor batch: object arrays of plain values allowed."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("verl.protocol", "DataProto"):
            return _DataProtoState
        if (module, name) == ("numpy", "dtype"):
            return _any_dtype
        return super().find_class(module, name)

    def _numpy_ndarray(self, shape: Any, dtype: Any = float, *rest: Any) -> Any:
        import numpy as np

        checked = np.dtype(dtype)
        if checked.kind != "O":
            return super()._numpy_ndarray(shape, dtype, *rest)
        if rest:
            raise dp.Refused("numpy.ndarray with a buffer, offset or strides")
        self._budget.charge(dp._elements(shape) * 8, f"an array of shape {shape!r:.60}")
        array = np.empty(shape, dtype=object)
        self.arrays.append(array)
        return array

    def load_checked(self) -> Any:
        value = self.load()
        for array in self.arrays:
            if array.dtype.kind != "O":
                dp.checked_dtype(array.dtype)
        return value


class _BatchUnpickler(dp.DumpUnpickler):
    """A consolidated TensorDict's torch.save archive: its leaves as numpy arrays by name."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("tensordict._reductions", "_rebuild_tensordict_files_consolidated"):
            return self._leaves
        return super().find_class(module, name)

    def _leaves(self, metadata: Any, storage: Any) -> dict[str, np.ndarray]:
        import numpy as np

        if not isinstance(metadata, dict) or not isinstance(metadata.get("leaves"), dict):
            raise dp.Unreadable("a consolidated TensorDict without its leaves")
        out = {}
        for key, leaf in metadata["leaves"].items():
            if not (isinstance(leaf, tuple) and len(leaf) == 5 and leaf[0] in _DTYPES):
                raise dp.Unreadable(f"tensor {key!r:.40} of a kind not read ({leaf!r:.60})")
            dtype_name, shape, start, stop, pad = leaf
            raw = storage[start:stop]
            code = _DTYPES[dtype_name]
            if code == "bf16":
                widened = (raw.view(self._byteorder + "u2").astype(np.uint32) << 16).view("f4")
            else:
                widened = raw.view(np.dtype(code).newbyteorder(self._byteorder))
            count = dp._elements(tuple(shape))
            if pad:
                widened = widened[:count]
            if widened.size != count:
                raise dp.Unreadable(f"tensor {key!r:.40} does not fill its shape {shape}")
            self._budget.charge(widened.nbytes, f"tensor {key!r:.40}")
            out[key] = widened.reshape(shape).astype(widened.dtype.newbyteorder("="))
        return out


def _payload(path: Path) -> dict[str, Any]:
    """The batch's arrays and the uids of the DataProto pickled at `path`."""
    budget = dp.Budget(path.stat().st_size)
    with open(path, "rb") as file:
        proto = _OuterUnpickler(file, budget).load_checked()
    state = proto.state if isinstance(proto, _DataProtoState) else None
    if not (isinstance(state, tuple) and len(state) == 3 and isinstance(state[0], bytes)):
        raise d.Malformed(f"not a DataProto pickled by save_to_disk ({WHAT})")
    batch_bytes, non_tensor, _meta = state
    batch = dp.read_archive(io.BytesIO(batch_bytes), budget, _BatchUnpickler)
    if not isinstance(batch, dict) or not isinstance(non_tensor, dict):
        raise d.Malformed("a DataProto whose batch is not a consolidated TensorDict")
    return {**batch, "uid": non_tensor.get("uid")}


def _group_index(uid: np.ndarray | None, prompts: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The uid's order of first appearance, or runs of one repeated prompt without uids."""
    import numpy as np

    if uid is not None:  # strings, one per row (DECLARED)
        _, first, inverse = np.unique(uid.astype(str), return_index=True, return_inverse=True)
        return np.argsort(np.argsort(first))[inverse].astype(np.int64)
    if not len(prompts):
        return np.zeros(0, dtype=np.int64)
    masked = np.where(keep, prompts, -1)
    changed = np.any(masked[1:] != masked[:-1], axis=1)
    return np.concatenate([[0], np.cumsum(changed)]).astype(np.int64)


def _lists(values: np.ndarray, lengths: np.ndarray, dtype: pl.DataType) -> pl.Series:
    """Consecutive runs of `values`, `lengths` long, as a list column of `dtype`."""
    import numpy as np
    import pyarrow as pa

    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    lists = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    return pl.Series(pl.from_arrow(lists)).cast(pl.List(dtype))


class VerlFormat(DumpFormat):
    """verl's `DataProto.save_to_disk` dumps (the rollout skip manager's)."""

    name = "verl"
    suffixes = (SUFFIX,)
    what = WHAT
    holds = "plain values, numpy arrays and the batch's tensors"

    def is_dump(self, path: Path) -> bool:
        return is_verl_dump(path)

    def find(
        self, path: Path, refused: list[Violation] | None = None
    ) -> tuple[dict[int, Path], list[str]]:
        return find_verl_dumps(path, refused)

    def unpickle(self, path: Path) -> Any:
        return _payload(path)

    def rows(
        self, payload: Any, path: Path, step: int | None, options: dict[str, Any]
    ) -> pl.DataFrame:
        assert step is not None, "a verl dump's step comes from its path"
        sizes = d.check(payload, DECLARED, WHAT, nonzero=NONZERO)
        return _rows(payload, sizes, path, step)


FORMAT = VerlFormat()


def read_verl_dump(path: Path, step: int) -> pl.DataFrame:
    """One input row per row of a verl DataProto dump (module docstring)."""
    return read_dump(FORMAT, Path(path), step)


def _rows(batch: dict[str, Any], sizes: dict[str, int], path: Path, step: int) -> pl.DataFrame:
    import numpy as np

    rows, prompt_width, width = sizes["rows"], sizes["prompt"], sizes["response"]
    attention = batch["attention_mask"].astype(np.int64)
    if not np.isin(attention, (0, 1)).all() or (
        (np.diff(attention[:, :prompt_width], axis=1) < 0).any()
        or (np.diff(attention[:, prompt_width:], axis=1) > 0).any()
    ):
        raise d.Malformed(
            "attention_mask is not a left-padded prompt and a "
            "right-padded response (verl's agent loop pads so)",
        )
    keep = attention.astype(bool)
    ids = np.concatenate([batch["prompts"], batch["responses"]], axis=1).astype(np.int64)
    if keep.any() and (ids[keep].min() < 0 or ids[keep].max() > INT32_MAX):
        raise d.Malformed("token ids beyond int32")
    response_length = keep[:, prompt_width:].sum(axis=1)
    last = (response_length - 1) % width
    scores = batch["rm_scores"]
    elsewhere = scores.copy()
    elsewhere[np.arange(rows), last] = 0
    if (elsewhere != 0).any():
        raise d.Malformed(
            "rm_scores has scores away from the last response token; "
            "verl's agent loop puts one score there",
        )
    in_response = keep[:, prompt_width:]
    mask = batch["response_mask"].astype(np.int64)[in_response]
    if mask.size and (mask.min() < -128 or mask.max() > 127):
        raise d.Malformed("response_mask values beyond int8")
    columns = {
        c.STEP: pl.Series(np.full(rows, step, dtype=np.int64)),
        c.GROUP_INDEX: pl.Series(
            _group_index(batch["uid"], batch["prompts"], keep[:, :prompt_width])
        ),
        c.INDEX: pl.Series(np.arange(rows, dtype=np.int64)),
        c.STATUS: pl.Series(np.where(response_length == width, "truncated", "completed")),
        c.TOKENS: _lists(ids[keep], keep.sum(axis=1), pl.Int32()),
        c.RESPONSE_LENGTH: pl.Series(response_length.astype(np.int32)),
        c.LOSS_MASK: _lists(mask, response_length, pl.Int8()),
        c.REWARD: pl.Series(scores[np.arange(rows), last].astype(np.float64)),
    }
    if "rollout_log_probs" in batch:
        values = batch["rollout_log_probs"].astype(np.float32)[in_response]
        columns[c.ROLLOUT_LOG_PROBS] = _lists(values, response_length, pl.Float32())
    return pl.DataFrame(columns)
