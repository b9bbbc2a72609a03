"""Reading torch's `torch.save` format safely: a zip archive holding `<name>/data.pkl` (a
pickle, protocol 2) and one `<name>/data/<key>` file of raw bytes per tensor storage.

Loading never runs code from the file and does not need torch: the archive is opened with
`zipfile` and its pickle read by a restricted `pickle.Unpickler` that allows what
`torch.load(weights_only=True)` allows for this data (tensors, rebuilt as numpy arrays from
the archive's storages; numeric numpy arrays and scalars, since routing-replay dumps carry
`rollout_routed_experts` as int32 arrays; `OrderedDict`, read as a dict; plain builtins).
Anything else is refused. torch is not used even when installed, so shards do not depend
on it. Every format's reader (`pipeline.io.formats`) builds on this one; what it raises
becomes one line in `frame.read_dump`.

What a file may make the reader allocate is bounded by the file's own size
(`ARRAYS_PER_BYTE`, `FLOOR`): a few bytes of pickle can otherwise ask for an array of
any shape, or a tensor whose zero strides repeat one stored element without end. Only the
arrays the unpickler itself built are checked afterwards (they are tracked on the
unpickler), so the rest of the payload is never walked.
"""

from __future__ import annotations

import functools
import io
import math
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

# A dump may build at most ARRAYS_PER_BYTE bytes of arrays and, in `formats.values`,
# VALUES_PER_BYTE column values per byte of its file, and at least FLOOR of either. A
# bfloat16 storage is read (2 bytes an element), widened to float32 (4) and copied out as a
# tensor (4): 5 per byte of file, the most a real dump needs.
ARRAYS_PER_BYTE = 8
VALUES_PER_BYTE = 4
FLOOR = 1 << 20

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
LEGACY_FORMAT = (
    "written in torch's legacy (pre-1.6, non-zip) torch.save format, which is read only "
    "with torch; re-save it with a current torch.save"
)


class Refused(Exception):
    """The file asks for something outside the allowlist; nothing from it has run."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class Unreadable(Exception):
    """The file is not a torch.save archive this reader understands."""


class TooBig(Exception):
    """The file asks for more than a file of its size may build."""


class Budget:
    """What a dump of `file_size` bytes may still build: `per_byte` of `unit` per byte."""

    def __init__(
        self, file_size: int, per_byte: int = ARRAYS_PER_BYTE, unit: str = "bytes of arrays"
    ) -> None:
        self.file_size = file_size
        self.per_byte = per_byte
        self.limit = max(FLOOR, per_byte * file_size)
        self.left = self.limit
        self.unit = unit

    def charge(self, amount: int, what: str) -> None:
        self.left -= amount
        if self.left < 0:
            raise TooBig(
                f"{what} takes it beyond the {self.limit:,} {self.unit} a dump of "
                f"{self.file_size:,} bytes may build ({self.per_byte} per byte of the file, "
                f"at least {FLOOR:,})"
            )


# torch.save writes pickle protocol 2, so the builtins come as `__builtin__` names.
_BUILTIN_MODULES = ("builtins", "__builtin__")
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


class _StorageType:
    def __init__(self, name: str) -> None:
        self.name = name


def _encode(text: str, encoding: str = "latin1") -> bytes:
    """`_codecs.encode` as protocol 2 uses it for bytes, and only that."""
    if encoding != "latin1" or not isinstance(text, str):
        raise Refused(f"_codecs.encode with {encoding!r}")
    return text.encode("latin1")


def _bytearray(*args: Any) -> bytearray:
    """`bytearray` as protocol 2 pickles one (its text and `latin-1`), never `bytearray(n)`,
    which would allocate n bytes."""
    if args and isinstance(args[0], str) and args[1:] in ((), ("latin-1",), ("latin1",)):
        return bytearray(args[0], "latin-1")
    if len(args) == 1 and isinstance(args[0], bytes):
        return bytearray(args[0])
    if not args:
        return bytearray()
    raise Refused(f"bytearray of {type(args[0]).__name__}")


_BUILTINS: dict[str, Any] = {
    "set": set,
    "frozenset": frozenset,
    "complex": complex,
    "bytearray": _bytearray,
}


def checked_dtype(dtype: Any) -> Any:
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype.kind not in _NUMERIC_KINDS or dtype.hasobject or dtype.fields:
        raise Refused(f"numpy arrays of dtype {dtype} (only numeric arrays are read)")
    return dtype


def _numpy_dtype(*args: Any) -> Any:
    import numpy as np

    return checked_dtype(np.dtype(*args))


def _numpy_scalar(dtype: Any, data: Any = None) -> Any:
    import numpy as np

    dtype = checked_dtype(dtype)
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise Unreadable(f"a numpy {dtype} scalar without its {dtype.itemsize} bytes")
    return np.frombuffer(data, dtype=dtype)[0]


@functools.cache
def _numpy_globals() -> dict[tuple[str, str], Any]:
    import numpy as np

    found: dict[tuple[str, str], Any] = {("numpy", "dtype"): _numpy_dtype}
    # numpy 2 writes `numpy._core`, numpy 1.x `numpy.core`.
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        found[(module, "scalar")] = _numpy_scalar
    for code in "?bhilqBHILQefdgFDG":
        kind = type(np.dtype(code))
        found[("numpy.dtypes", kind.__name__)] = kind
    return found


def _elements(shape: Any) -> int:
    """The element count of a shape the pickle gives, refusing what is not a shape."""
    dims = (shape,) if isinstance(shape, int) else shape
    if not isinstance(dims, tuple) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in dims
    ):
        raise Unreadable(f"an array shape {shape!r:.40} that is not a tuple of sizes")
    return math.prod(dims)


class DumpUnpickler(pickle.Unpickler):
    """Rebuilds only plain values, tensors (as numpy arrays) and numeric numpy arrays,
    charging every array it builds to `budget` and keeping it in `arrays`."""

    def __init__(
        self,
        file: Any,
        budget: Budget,
        storages: Callable[[str], bytes] | None = None,
        byteorder: Literal["<", ">"] = "<",
    ) -> None:
        super().__init__(file)
        self._budget = budget
        self._storages = storages
        self._byteorder = byteorder
        self._loaded: dict[str, Any] = {}
        self.arrays: list[Any] = []

    def find_class(self, module: str, name: str) -> Any:
        if module in _BUILTIN_MODULES and name in _BUILTINS:
            return _BUILTINS[name]
        if (module, name) == ("collections", "OrderedDict"):
            return dict  # insertion-ordered; a dict takes no attributes from the pickle
        if (module, name) == ("_codecs", "encode"):
            return _encode
        if self._storages is not None:
            if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return self._rebuild_tensor
            if module == "torch" and name in _STORAGE_DTYPES:
                return _StorageType(name)
        if name == "_reconstruct" and module in ("numpy._core.multiarray", "numpy.core.multiarray"):
            return self._numpy_reconstruct
        if (module, name) == ("numpy", "ndarray"):
            return self._numpy_ndarray
        numpy_global = _numpy_globals().get((module, name))
        if numpy_global is not None:
            return numpy_global
        raise Refused(f"{module}.{name}")

    def load_checked(self) -> Any:
        """The payload, once numpy's own `__setstate__` is known to have left every array
        the pickle built numeric."""
        value = self.load()
        for array in self.arrays:
            checked_dtype(array.dtype)
        return value

    def persistent_load(self, pid: Any) -> Any:
        if self._storages is None:
            raise Refused("a persistent id (a tensor storage outside a torch.save archive)")
        if (
            not isinstance(pid, tuple)
            or len(pid) < 5
            or pid[0] != "storage"
            or not isinstance(pid[1], _StorageType)
        ):
            raise Refused(f"storage {pid!r:.80}")
        storage_type, key, numel = pid[1], str(pid[2]), pid[4]
        if key not in self._loaded:
            self._loaded[key] = self._storage(storage_type.name, key, numel)
        return self._loaded[key]

    def _storage(self, storage_name: str, key: str, numel: Any) -> Any:
        import numpy as np

        assert self._storages is not None
        try:
            data = self._storages(key)
        except KeyError:
            raise Unreadable(f"storage data/{key} is missing from the archive") from None
        code = _STORAGE_DTYPES[storage_name]
        if code == "bf16":  # numpy has no bfloat16: widen to float32, which holds it exactly
            self._budget.charge(2 * len(data), f"widening bfloat16 storage data/{key}")
            raw = np.frombuffer(data, dtype=np.dtype(self._byteorder + "u2"))
            array = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(data, dtype=np.dtype(code).newbyteorder(self._byteorder))
        if not isinstance(numel, int) or array.size != numel:
            raise Unreadable(f"storage data/{key} holds {array.size} elements, not {numel}")
        return array

    def _rebuild_tensor(
        self, storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any
    ) -> Any:
        import numpy as np

        if not isinstance(size, tuple | list) or not isinstance(stride, tuple | list):
            raise Unreadable("a tensor with malformed rebuild arguments")
        shape, steps = tuple(size), tuple(stride)
        if (
            not isinstance(storage, np.ndarray)
            or not isinstance(offset, int)
            or len(shape) != len(steps)
            or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0
                for n in shape + steps + (offset,)
            )
        ):
            raise Unreadable("a tensor with malformed rebuild arguments")
        count = math.prod(shape)
        # Zero or overlapping strides repeat stored elements: the copy is what costs.
        self._budget.charge(count * storage.itemsize, f"a tensor of shape {shape!r:.60}")
        if count == 0:
            array = np.empty(shape, dtype=storage.dtype.newbyteorder("="))
        else:
            last = offset + sum((n - 1) * s for n, s in zip(shape, steps, strict=True))
            if last >= storage.size:
                raise Unreadable("a tensor reaching past the end of its storage")
            view = np.lib.stride_tricks.as_strided(
                storage[offset:],
                shape=shape,
                strides=tuple(s * storage.itemsize for s in steps),
                writeable=False,
            )
            array = np.array(view, dtype=storage.dtype.newbyteorder("="))
        self.arrays.append(array)
        return array

    def _numpy_reconstruct(self, cls: Any, shape: Any, dtype_code: Any) -> Any:
        """numpy's `_reconstruct`: an empty array that the pickle then fills (`__setstate__`
        takes its bytes from the pickle itself); the shape it asks for is charged first."""

        if cls != self._numpy_ndarray:
            raise Refused(f"numpy _reconstruct of {cls!r:.60}")
        return self._numpy_ndarray(shape, dtype_code)

    def _numpy_ndarray(self, shape: Any, dtype: Any = float, *rest: Any) -> Any:
        """`numpy.ndarray(shape, dtype)`: uninitialised memory of the shape the pickle names,
        so the shape is charged before anything is allocated; buffers are not taken."""
        import numpy as np

        if rest:
            raise Refused("numpy.ndarray with a buffer, offset or strides")
        checked = checked_dtype(dtype)
        self._budget.charge(_elements(shape) * checked.itemsize, f"an array of shape {shape!r:.60}")
        array = np.ndarray.__new__(np.ndarray, shape, checked)
        self.arrays.append(array)
        return array


def _member(archive: zipfile.ZipFile, name: str, file_size: int) -> bytes:
    info = archive.getinfo(name)
    if info.file_size > file_size:
        raise TooBig(
            f"archive member {name} unpacks to {info.file_size:,} bytes, more than the "
            f"{file_size:,} of the whole file"
        )
    # Read with a size, so a compressed member is never inflated past what it declares.
    with archive.open(info) as member:
        data = member.read(info.file_size)
    if len(data) != info.file_size:
        raise Unreadable(f"archive member {name} is shorter than it declares")
    return data


def read_archive(
    path: Path | io.BytesIO, budget: Budget, unpickler: type[DumpUnpickler] = DumpUnpickler
) -> Any:
    """A torch.save zip archive (a file, or its bytes) read by `unpickler`."""
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise Unreadable("a zip file without one <archive>/data.pkl")
        prefix = pickles[0].removesuffix("data.pkl")
        order = "little"
        if prefix + "byteorder" in names:
            raw_order = _member(archive, prefix + "byteorder", budget.file_size)
            order = raw_order.decode("ascii", "replace").strip()
        if order not in ("little", "big"):
            raise Unreadable(f"unknown byte order {order!r:.20}")

        def storage(key: str) -> bytes:
            name = f"{prefix}data/{key}"
            data = _member(archive, name, budget.file_size)
            budget.charge(len(data), f"storage data/{key}")
            return data

        data = _member(archive, pickles[0], budget.file_size)
        # A buffered reader lets the C unpickler take the input in large chunks.
        reader = unpickler(
            io.BufferedReader(io.BytesIO(data)),
            budget,
            storages=storage,
            byteorder="<" if order == "little" else ">",
        )
        return reader.load_checked()


def read_torch_save(path: Path) -> Any:
    """A torch.save file read with the standard library and numpy; tensors become arrays.
    Raises Refused, Unreadable or TooBig."""
    size = path.stat().st_size
    budget = Budget(size)
    with open(path, "rb") as file:
        head = file.read(4)
    if head == b"PK\x03\x04":
        return read_archive(path, budget)
    with open(path, "rb") as file:
        value = DumpUnpickler(file, budget).load_checked()
        if type(value) is int and value == _LEGACY_MAGIC:
            raise Unreadable(LEGACY_FORMAT)
    raise Unreadable("a plain pickle, not a torch.save file")


def first_sentence(exc: BaseException) -> str:
    """The exception's first sentence: torch and Polars append paragraphs of advice."""
    text = str(exc).strip()
    first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
