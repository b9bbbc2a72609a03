"""How a setting is declared, shared by the settings core (`pipeline.settings`) and each
trainer's settings model (`pipeline/trainers/<name>/settings.py`): the marks of strict
integers and the field helper with its metadata."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any


class Minimum:
    """The mark of a strict integer of at least `value` (never a bool, a float or a text)."""

    def __init__(self, value: int) -> None:
        self.value = value


Positive = Annotated[int, Minimum(1)]
NonNegative = Annotated[int, Minimum(0)]
# A count: an integer of at least 1.
Count = Positive


def setting(
    description: str,
    default: Any = dataclasses.MISSING,
    recorded: bool = True,
    valued: bool = False,
) -> Any:
    """A field of a settings model. `recorded=False`: a run option that does not change
    what is built (not in the manifest, not in the rerun digests); `valued`: a boolean
    named after a trainer's configuration key, given a value on the command line as there
    (`--balance-batch false`) rather than as a switch."""
    metadata = {"description": description, "recorded": recorded, "valued": valued}
    return dataclasses.field(default=default, metadata=metadata)
