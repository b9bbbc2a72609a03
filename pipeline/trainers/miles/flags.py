"""miles' command-line readers: the flags whose value is not one scalar type, read as
miles' (Megatron's) own parser reads them."""

from __future__ import annotations

import ast
from typing import Any

# The most layers a `--moe-layer-freq` list may expand to (Megatron's largest models have a
# few hundred): `[1]*65536*65536` would otherwise fill the memory before any check.
MAX_PATTERN_LAYERS = 1 << 16


class _TooLong(ValueError):
    """A layer pattern that expands beyond MAX_PATTERN_LAYERS."""


def parse_layer_pattern(text: str) -> int | list[int]:
    """`--moe-layer-freq` as Megatron reads it: an integer, or a list expression of
    integers, `+` and `*` (`([0]+[1]*23)`), evaluated here without `eval`, into at most
    MAX_PATTERN_LAYERS layers."""
    shown = repr(text) if len(text) <= 80 else f"{text[:60]!r} ... ({len(text):,} characters)"
    try:
        value: int | list[int] = _pattern(ast.parse(text.strip(), mode="eval").body)
    except _TooLong:
        raise ValueError(
            f"the layer pattern {shown} lists more than {MAX_PATTERN_LAYERS:,} layers"
        ) from None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ValueError(f"not an integer or a layer pattern like [0,1,1,1]: {shown}") from None
    return value


def _bounded(pattern: list[int]) -> list[int]:
    if len(pattern) > MAX_PATTERN_LAYERS:
        raise _TooLong()
    return pattern


def _pattern(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        return _bounded([_pattern(item) for item in node.elts])
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _pattern(node.left), _pattern(node.right)
        if isinstance(node.op, ast.Add) and type(left) is type(right) is list:
            return _bounded(left + right)
        if isinstance(node.op, ast.Add) and type(left) is type(right):
            return left + right
        if isinstance(node.op, ast.Mult) and {type(left), type(right)} == {list, int}:
            times, items = (left, right) if isinstance(left, int) else (right, left)
            if len(items) * max(times, 0) > MAX_PATTERN_LAYERS:
                raise _TooLong()
            return items * times
    raise ValueError("not a layer pattern")


# Command-line readers of the settings whose value is not one scalar type.
FLAG_READERS = {"moe_layer_freq": parse_layer_pattern}
