"""The trainers' dump formats behind one registry: a new format is a module defining a
`DumpFormat` (`frame`) and a line here, and inherits every guarantee of the one frame
(`frame.read_dump`): restricted unpickle, declared shapes and types, one line naming the
file for whatever is wrong. Discovery and loading go through `FORMATS` by a source's
`kind`; nothing outside this package names a format."""

from __future__ import annotations

from pipeline.io.formats.frame import DumpFormat, read_dump
from pipeline.io.formats.miles import FORMAT as _MILES
from pipeline.io.formats.verl import FORMAT as _VERL

FORMATS: dict[str, DumpFormat] = {fmt.name: fmt for fmt in (_MILES, _VERL)}

__all__ = ["FORMATS", "DumpFormat", "read_dump"]
