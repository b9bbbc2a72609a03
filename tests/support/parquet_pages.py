"""A Parquet file as what it holds, not how a writer spelled it: the footer without
`created_by` and byte offsets, and every page's header, decoded repetition and definition
levels and value bytes. Two files with the same `decoded` content read back as the same
pages of the same values, whatever RLE/bit-packing runs their writers chose for the levels
(Polars 1.42 and 2.x choose differently for short lists)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

_CODECS = {"ZSTD": "zstd", "LZ4": "lz4", "SNAPPY": "snappy", "GZIP": "gzip"}
_DATA_PAGE = 0
# Footer and page-header fields that only place bytes (offsets, sizes) or name the writer.
_PLACEMENT = {
    "created_by",
    "serialized_size",
    "total_byte_size",
    "file_offset",
    "data_page_offset",
    "dictionary_page_offset",
    "index_page_offset",
    "total_compressed_size",
    "total_uncompressed_size",
}


class _Compact:
    """Thrift's compact protocol, enough for Parquet page headers."""

    def __init__(self, data: bytes, at: int) -> None:
        self.data = data
        self.at = at

    def _byte(self) -> int:
        value = self.data[self.at]
        self.at += 1
        return value

    def varint(self) -> int:
        result = shift = 0
        while True:
            byte = self._byte()
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    def _zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def _value(self, kind: int) -> Any:
        if kind in (1, 2):
            return kind == 1
        if kind == 3:
            return struct.unpack("b", bytes([self._byte()]))[0]
        if kind in (4, 5, 6):
            return self._zigzag()
        if kind == 7:
            self.at += 8
            return struct.unpack("<d", self.data[self.at - 8 : self.at])[0]
        if kind == 8:
            size = self.varint()
            self.at += size
            return self.data[self.at - size : self.at]
        if kind in (9, 10):
            head = self._byte()
            count = self.varint() if head >> 4 == 15 else head >> 4
            return [self._value(head & 15) for _ in range(count)]
        if kind == 12:
            return self.struct()
        raise ValueError(f"thrift compact type {kind}")

    def struct(self) -> dict[int, Any]:
        fields: dict[int, Any] = {}
        last = 0
        while (head := self._byte()) != 0:
            last = last + (head >> 4) if head >> 4 else self._zigzag()
            fields[last] = self._value(head & 15)
        return fields


def _levels(data: bytes, bit_width: int, count: int) -> list[int]:
    """An RLE/bit-packed hybrid run sequence as the level values it encodes."""
    reader = _Compact(data, 0)
    levels: list[int] = []
    width_bytes = (bit_width + 7) // 8
    while reader.at < len(data) and len(levels) < count:
        head = reader.varint()
        if head & 1:
            groups = head >> 1
            packed = int.from_bytes(data[reader.at : reader.at + groups * bit_width], "little")
            reader.at += groups * bit_width
            mask = (1 << bit_width) - 1
            levels += [(packed >> (i * bit_width)) & mask for i in range(groups * 8)]
        else:
            value = int.from_bytes(data[reader.at : reader.at + width_bytes], "little")
            reader.at += width_bytes
            levels += [value] * (head >> 1)
    return levels[:count]


def _length_prefixed(body: bytes, at: int) -> tuple[bytes, int]:
    (size,) = struct.unpack("<i", body[at : at + 4])
    return body[at + 4 : at + 4 + size], at + 4 + size


def decoded(path: Path) -> list[Any]:
    """The file's footer (placement fields and `created_by` dropped) and its pages, each
    as (column, header without sizes, repetition levels, definition levels, value bytes)."""
    data = path.read_bytes()
    parquet = pq.ParquetFile(path)
    meta = parquet.metadata
    footer = meta.to_dict()
    for group in footer["row_groups"]:
        for column in group["columns"]:
            for key in _PLACEMENT & set(column):
                column.pop(key)
        for key in _PLACEMENT & set(group):
            group.pop(key)
    for key in _PLACEMENT & set(footer):
        footer.pop(key)
    pages: list[Any] = []
    for g in range(meta.num_row_groups):
        for i in range(meta.num_columns):
            chunk = meta.row_group(g).column(i)
            described = meta.schema.column(i)
            codec = pa.Codec(_CODECS[chunk.compression])
            at = chunk.dictionary_page_offset or chunk.data_page_offset
            end = at + chunk.total_compressed_size
            while at < end:
                reader = _Compact(data, at)
                header = reader.struct()
                body = codec.decompress(
                    data[reader.at : reader.at + header[3]], header[2]
                ).to_pybytes()
                at = reader.at + header[3]
                sizes_dropped = {k: v for k, v in header.items() if k not in (2, 3, 4)}
                if header[1] != _DATA_PAGE:
                    pages.append((chunk.path_in_schema, sizes_dropped, [], [], body))
                    continue
                count = header[5][1]
                rep: list[int] = []
                defs: list[int] = []
                offset = 0
                if described.max_repetition_level:
                    runs, offset = _length_prefixed(body, offset)
                    rep = _levels(runs, described.max_repetition_level.bit_length(), count)
                if described.max_definition_level:
                    runs, offset = _length_prefixed(body, offset)
                    defs = _levels(runs, described.max_definition_level.bit_length(), count)
                pages.append((chunk.path_in_schema, sizes_dropped, rep, defs, body[offset:]))
    return [footer, pages]


def decoded_digest(path: Path) -> str:
    """sha256 of `decoded(path)`: equal for two files that hold the same pages of values."""
    return hashlib.sha256(repr(decoded(path)).encode()).hexdigest()
