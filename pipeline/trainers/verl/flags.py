"""verl's command-line readers: none beyond the scalar ones. Its booleans take a value
(`--balance-batch false`), as verl's keys do: the settings model marks them `valued`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Command-line readers of the settings whose value is not one scalar type.
FLAG_READERS: dict[str, Callable[[str], Any]] = {}
