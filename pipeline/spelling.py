"""The setting or flag a user most likely meant, for a name no setting or flag has.

miles spells its flags with dashes (`--global-batch-size`) and a settings file spells the
same settings with underscores (`global_batch_size`); a name written in the other spelling
is named back in the right one, and a near miss (`global_batch_sise`) by its closest name.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# How alike two names must be (difflib's ratio) for the one to be offered for the other.
CUTOFF = 0.75


def _plain(name: str) -> str:
    return name.lstrip("-").replace("-", "_").lower()


def closest(name: str, known: Iterable[str]) -> str | None:
    """The name of `known` that `name` means in another spelling, else the nearest one of
    them, else None."""
    names = list(known)
    by_plain = {_plain(k): k for k in names}
    if (same := by_plain.get(_plain(name))) is not None:
        return same
    found = difflib.get_close_matches(_plain(name), list(by_plain), n=1, cutoff=CUTOFF)
    return by_plain[found[0]] if found else None


def unknown_names(given: Iterable[object], known: Iterable[str]) -> str | None:
    """`unknown setting(s) <name> (did you mean <right name>?)` for the names of `given`
    that `known` lacks, or None when there are none."""
    names = list(known)
    unknown = [name for name in given if name not in names]
    if not unknown:
        return None
    words = []
    for name in unknown:
        shown = name if isinstance(name, str) and name.isprintable() else repr(name)
        near = closest(name, names) if isinstance(name, str) else None
        words.append(f"{shown} (did you mean {near}?)" if near is not None else shown)
    return f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(words)}"
