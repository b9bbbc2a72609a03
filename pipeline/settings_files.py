"""Where settings come from besides flags and run config: settings files (YAML, read as
`build` and `validate` read them) and the `rollout-shards.yaml` beside the data; and how
they stack up (`stacked`). `pipeline.settings` checks what they give."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.errors import UsageError
from pipeline.spelling import unknown_names

# Boolean settings that default to on are turned off by a miles-style --disable-* flag.
DISABLE_FLAGS = {
    "rewards_normalization": "disable_rewards_normalization",
    "grpo_std_normalization": "disable_grpo_std_normalization",
}


def read_config(path: str | Path | None, known: Sequence[str]) -> dict[str, Any]:
    """Settings from a YAML file (a mapping of setting names), or {} without one."""
    if path is None:
        return {}
    from pipeline.yaml_config import ConfigError, load_mapping, read_text

    try:
        data = load_mapping(read_text(Path(path)))
    except ConfigError as exc:
        raise UsageError(f"config {path}{exc}") from None
    if (unknown := unknown_names(data, [*known, *DISABLE_FLAGS.values()])) is not None:
        raise UsageError(f"config {path}: {unknown}")
    for setting, flag in DISABLE_FLAGS.items():
        if flag not in data:
            continue
        if setting in data:
            raise UsageError(f"config {path} sets both {setting} and {flag}: keep one")
        data[setting] = not _boolean(flag, data.pop(flag))
    return data


def _boolean(flag: str, value: Any) -> bool:
    """A --disable-* flag's value in a settings file, read as a boolean setting is."""
    if type(value) is bool:
        return value
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError as exc:
        raise UsageError(f"invalid settings: {flag}: {exc.errors()[0]['msg']}") from None


# An input root may carry the settings its data was written for; they rank below
# --config and flags.
DATA_SETTINGS = "rollout-shards.yaml"


def data_settings_files(inputs: Sequence[str | Path]) -> list[Path]:
    """The settings file of each input's root: an input root holds it; a step file or
    folder given alone finds the one of the root it sits in (`root/step=<N>.parquet`,
    `root/step=<N>/part.jsonl`)."""
    found: list[Path] = []
    for raw in inputs:
        path = Path(raw)
        root = path if path.is_dir() else path.parent
        # Anything under the name is read (a FIFO or a folder there is refused, not passed over).
        if root.name.lower().startswith("step=") and not os.path.lexists(root / DATA_SETTINGS):
            root = root.parent
        if os.path.lexists(root / DATA_SETTINGS) and root / DATA_SETTINGS not in found:
            found.append(root / DATA_SETTINGS)
    return found


def stacked(
    config: str | Path | None,
    data_configs: Sequence[Path],
    known: Sequence[str],
    **overrides: Any,
) -> dict[str, Any]:
    """The settings given: beside the data, then the YAML file, then explicit overrides
    (flags or run config), each above the one before; `known`: every setting's name."""
    values: dict[str, Any] = {}
    for path in data_configs:
        values.update(read_config(path, known))
    values.update(read_config(config, known))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return values
