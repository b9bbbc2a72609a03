"""Run config of a build: the settings of the contract, typed, under their own names.

`BuildConfig` is derived from `pipeline.settings.Settings`, field by field: each setting
becomes an optional field (a `Literal` becomes an enum, which Dagster's launchpad offers
as a choice) with the setting's description. A field left unset keeps the value from the
settings files (`ROLLOUT_SHARDS_CONFIG`, then the input root's `rollout-shards.yaml`, then
the defaults), so the launchpad only needs what a run changes.
"""

from __future__ import annotations

import typing
from enum import Enum, StrEnum
from typing import Any

import dagster as dg
from pydantic import Field, create_model

from pipeline.errors import UsageError
from pipeline.settings import non_null, setting_fields
from pipeline.trainers import flag_readers

# every trainer's readers of a setting given as text (`moe_layer_freq`)
FLAG_READERS = flag_readers()


def _optional(name: str, annotation: Any) -> Any:
    """The type of a setting as an optional run-config field. A setting read from text on
    the command line (`moe_layer_freq`: an integer or a layer pattern) is text here too;
    a list of choices is a list of texts (the settings check the choices)."""
    base = non_null(annotation)
    if name in FLAG_READERS:
        return str | None
    if typing.get_origin(base) is list:
        return list[str] | None
    if typing.get_origin(base) is typing.Literal:
        values = typing.get_args(base)
        enum_name = "".join(part.title() for part in name.split("_"))
        base = StrEnum(enum_name, {value: value for value in values})
    return base | None


def _read(name: str, text: str) -> Any:
    """A text field read as its command-line flag is; a usage error naming it otherwise."""
    try:
        return FLAG_READERS[name](text)
    except ValueError as exc:
        raise UsageError(f"invalid settings: {name}: {exc}") from None


class _Overrides(dg.Config):
    def overrides(self) -> dict[str, Any]:
        """The settings this run sets, as plain values for `load_settings`."""
        values = {}
        for name, _, _ in setting_fields():
            value = getattr(self, name)
            if value is not None and name in FLAG_READERS:
                values[name] = _read(name, value)
            elif value is not None:
                values[name] = value.value if isinstance(value, Enum) else value
        return values


BuildConfig = create_model(  # type: ignore[call-overload]
    "BuildConfig",
    __base__=_Overrides,
    __doc__="Settings overrides for one run, named as miles' flags.",
    __module__=__name__,
    **{
        name: (
            _optional(name, annotation),
            Field(None, description=f"{description} Unset: from the settings files."),
        )
        for name, annotation, description in setting_fields()
    },
)
