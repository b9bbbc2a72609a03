"""A settings file read strictly: YAML whose every value means one thing.

PyYAML reads YAML 1.1, where `1:04` is the base-60 number 64, `010` the octal 8 and
`1_000` the number 1000, while YAML 1.2 (and most other tools) read text, 10 and text; it
lets a key given twice win silently, and a 5000-digit integer or a nesting thousands of
levels deep ends in a traceback. Here PyYAML only parses (its parser keeps its own stack,
so depth costs no recursion); the values are built from its events under YAML 1.2's core
schema, and each of those cases is refused naming the setting it sits under.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from pipeline.io.regular import read_regular

# A settings file is a mapping of names to scalars; a list or mapping under a setting is
# read (and refused by the settings' own types), but no deeper than this.
MAX_DEPTH = 32
# Integers beyond int64 are refused (those of many digits before Python reads them).
MAX_INT = 2**63 - 1

# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution).
_NULL = re.compile(r"~|null|Null|NULL|")
_TRUE = re.compile(r"true|True|TRUE")
_FALSE = re.compile(r"false|False|FALSE")
_DECIMAL = re.compile(r"[-+]?[0-9]+")
_OCTAL = re.compile(r"0o[0-7]+")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF = re.compile(r"[-+]?\.(inf|Inf|INF)")
_NAN = re.compile(r"\.(nan|NaN|NAN)")
_STR_TAG = "tag:yaml.org,2002:str"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
# Longer plain scalars are not handed to PyYAML's number constructors (Python refuses to
# read an integer of more than 4300 digits).
_LONGEST_NUMBER = 40


class ConfigError(ValueError):
    """A settings file that is not read: the text follows `config <path>` (it starts with a
    space or a comma)."""


def read_text(path: Path) -> str:
    """A settings file's text: a regular file of UTF-8 (a FIFO or a device there would
    block the read or never end it)."""
    from pipeline.io import storage

    try:
        data = storage.fetch(path) if isinstance(path, storage.ObjectPath) else read_regular(path)
    except OSError as exc:
        raise ConfigError(f" cannot be read: {exc.strerror or exc}") from None
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ConfigError(" is not a text (UTF-8) YAML file") from None


def setting_name(name: object) -> str:
    """A setting's name for a message: as written when it is a plain name, else quoted
    with its escapes (a newline in a key must not split the error line)."""
    return name if isinstance(name, str) and name.isidentifier() else repr(name)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} chars)")


def _core(text: str, where: str) -> Any:
    """A plain scalar as YAML 1.2's core schema reads it; integers beyond int64 refused."""
    if _NULL.fullmatch(text):
        return None
    if _TRUE.fullmatch(text) or _FALSE.fullmatch(text):
        return _TRUE.fullmatch(text) is not None
    if _DECIMAL.fullmatch(text) or _OCTAL.fullmatch(text) or _HEX.fullmatch(text):
        digits = text.lstrip("+-")
        base = 10 if _DECIMAL.fullmatch(text) else 0  # 0o and 0x name their base
        negative = text.startswith("-")
        if len(digits) > _LONGEST_NUMBER or (value := int(digits, base)) > MAX_INT + negative:
            raise ConfigError(f", {where}: the integer {_shown(text)} is beyond int64")
        return -value if negative else value
    if _FLOAT.fullmatch(text):
        return float(text)
    if _INF.fullmatch(text):
        return float("-inf") if text.startswith("-") else float("inf")
    if _NAN.fullmatch(text):
        return float("nan")
    return text


def _yaml_1_1(text: str) -> Any:
    """A plain scalar as PyYAML (YAML 1.1) reads it when that is a number, else `text`."""
    resolver = yaml.resolver.Resolver()
    tag = resolver.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    if tag not in (_INT_TAG, _FLOAT_TAG):
        return text
    if len(text) > _LONGEST_NUMBER:
        return _TOO_LONG
    node = yaml.ScalarNode(tag, text)
    constructor = yaml.constructor.SafeConstructor()
    if tag == _INT_TAG:
        return constructor.construct_yaml_int(node)
    return constructor.construct_yaml_float(node)


_TOO_LONG = object()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _reading(value: Any) -> str:
    if value is _TOO_LONG:
        return "a number"
    return f"the text {value!r}" if isinstance(value, str) else repr(value)


def _scalar(event: yaml.ScalarEvent, where: str) -> Any:
    """A scalar's value under YAML 1.2's core schema; ConfigError where YAML 1.1 reads a
    number otherwise (or reads a number where 1.2 reads another value), where it is an
    integer beyond int64, or where it carries a tag other than text."""
    text = event.value
    if event.tag not in (None, "!", _STR_TAG):
        raise ConfigError(f", {where}: the tag {event.tag} is not read: write a plain value")
    if event.style is not None or event.tag is not None:  # quoted, or tagged as a text
        return text
    value = _core(text, where)
    older = _yaml_1_1(text)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if (number or older is not text) and not _same(value, older):
        raise ConfigError(
            f", {where}: {_shown(text)} reads as {_reading(older)} in YAML 1.1 and as "
            f"{_reading(value)} in YAML 1.2: write the value you mean, or quote a text"
        )
    return value


class _Builder:
    """Values from parser events, containers on an explicit stack."""

    def __init__(self) -> None:
        self.stack: list[dict[Any, Any] | list[Any]] = []
        self.keys: list[Any] = []  # per open mapping, the key awaiting its value
        self.anchors: dict[str, Any] = {}
        self.setting: str | None = None  # the top-level key the current value sits under
        self.lines: dict[Any, int] = {}  # line of each top-level key
        self.result: Any = None

    def where(self) -> str:
        """The setting whose value is being read, or the top level between settings."""
        in_value = len(self.stack) > 1 or (len(self.stack) == 1 and self.keys[0] is not _NO_KEY)
        return f"setting {setting_name(self.setting)}" if in_value else "the top level"

    def add(self, value: Any, event: yaml.Event) -> None:
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self.anchors[anchor] = value
        if not self.stack:
            self.result = value
            return
        container = self.stack[-1]
        if isinstance(container, list):
            container.append(value)
            return
        key = self.keys[-1]
        if key is _NO_KEY:
            self._key(container, value, event)
            return
        container[key] = value
        self.keys[-1] = _NO_KEY

    def _key(self, mapping: dict[Any, Any], key: Any, event: yaml.Event) -> None:
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        top = len(self.stack) == 1
        if top and not isinstance(key, str):
            raise ConfigError(f" has the key {key!r} on line {line}: a setting name is a text")
        if isinstance(key, dict | list):
            raise ConfigError(f", {self.where()}: the key on line {line} is a list or mapping")
        if key in mapping and top:
            lines = f"lines {self.lines[key]} and {line}"
            raise ConfigError(f" gives setting {setting_name(key)} twice, on {lines}: keep one")
        if key in mapping:
            where = self.where()
            raise ConfigError(f", {where}: the key {key!r} is given twice (line {line}): keep one")
        if top:
            self.setting = key
            self.lines[key] = line
        self.keys[-1] = key

    def open(self, container: dict[Any, Any] | list[Any], event: yaml.Event) -> None:
        tag = getattr(event, "tag", None)
        if tag not in (None, "!", _MAP_TAG if isinstance(container, dict) else _SEQ_TAG):
            raise ConfigError(f", {self.where()}: the tag {tag} is not read: write a plain value")
        if not self.stack and not isinstance(container, dict):
            raise ConfigError(" must be a mapping of setting names to values")
        if len(self.stack) >= MAX_DEPTH:
            raise ConfigError(f", {self.where()}: nested more than {MAX_DEPTH} levels deep")
        self.add(container, event)
        self.stack.append(container)
        self.keys.append(_NO_KEY)

    def close(self) -> None:
        self.stack.pop()
        self.keys.pop()


_NO_KEY = object()


def load_mapping(text: str) -> dict[str, Any]:
    """The settings of a YAML text: a mapping of setting names to values ({} for an empty
    file). ConfigError names what is refused and the setting it is under."""
    builder = _Builder()
    documents = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise ConfigError(" holds more than one YAML document")
            elif isinstance(event, yaml.ScalarEvent):
                where = builder.where()
                builder.add(_scalar(event, where), event)
            elif isinstance(event, yaml.MappingStartEvent):
                builder.open({}, event)
            elif isinstance(event, yaml.SequenceStartEvent):
                builder.open([], event)
            elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                builder.close()
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor not in builder.anchors:
                    where = builder.where()
                    raise ConfigError(f", {where}: the alias *{event.anchor} is not defined")
                builder.add(builder.anchors[event.anchor], event)
    except yaml.YAMLError as exc:
        # PyYAML's message spans lines (a caret under the spot): one line for the user.
        raise ConfigError(f" is not valid YAML: {' '.join(str(exc).split())}") from None
    if builder.result is None:
        return {}
    if not isinstance(builder.result, dict):
        raise ConfigError(" must be a mapping of setting names to values")
    return builder.result
