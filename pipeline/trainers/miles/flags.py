"""miles' command-line readers: the flags whose value is not one scalar type, read as
miles' (Megatron's) own parser reads them."""

from __future__ import annotations

import ast
from typing import Any


def parse_layer_pattern(text: str) -> int | list[int]:
    """`--moe-layer-freq` as Megatron reads it: an integer, or a list expression of
    integers, `+` and `*` (`([0]+[1]*23)`), evaluated here without `eval`."""
    try:
        value: int | list[int] = _pattern(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        raise ValueError(f"not an integer or a layer pattern like [0,1,1,1]: {text!r}") from None
    return value


def _pattern(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        return [_pattern(item) for item in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _pattern(node.left), _pattern(node.right)
        if isinstance(node.op, ast.Add) and type(left) is type(right):
            return left + right
        if isinstance(node.op, ast.Mult) and {type(left), type(right)} == {list, int}:
            times = left if isinstance(left, int) else right
            if times <= 1 << 16:
                return left * right
    raise ValueError(ast.dump(node))


# Command-line readers of the settings whose value is not one scalar type.
FLAG_READERS = {"moe_layer_freq": parse_layer_pattern}
