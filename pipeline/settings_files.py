"""Where settings come from besides flags and run config: settings files (YAML, read as
`build` and `validate` read them) and the `rollout-shards.yaml` beside the data; and how
they stack up (`stacked`). `pipeline.settings` checks what they give."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UsageError
from pipeline.io import storage
from pipeline.spelling import unknown_names

# Boolean settings that default to on are turned off by a miles-style --disable-* flag.
DISABLE_FLAGS = {
    "rewards_normalization": "disable_rewards_normalization",
    "grpo_std_normalization": "disable_grpo_std_normalization",
}


def read_config(
    path: str | Path | None, known: Sequence[str], sections: Mapping[str, Sequence[str]] = {}
) -> dict[str, Any]:
    """Settings from a YAML file (a mapping of setting names), or {} without one. A key
    named after a trainer (`sections`: each trainer's name and the settings it reads) holds
    that trainer's own values, a mapping of its settings, kept as it is under its name."""
    if path is None:
        return {}
    from pipeline.yaml_config import ConfigError, load_mapping, read_text

    try:
        data = load_mapping(read_text(path if isinstance(path, Path) else Path(path)))
    except ConfigError as exc:
        raise UsageError(f"config {path}{exc}") from None
    names = [*known, *DISABLE_FLAGS.values(), *sections]
    if (unknown := unknown_names(data, names)) is not None:
        raise UsageError(f"config {path}: {unknown}")
    for trainer, read in sections.items():
        if trainer not in data:
            continue
        section = data[trainer]
        if not isinstance(section, dict):
            raise UsageError(
                f"config {path}: {trainer}: a mapping of the {trainer} trainer's settings"
            )
        if (unknown := unknown_names(section, [*read, *DISABLE_FLAGS.values()])) is not None:
            where = unknown.replace("unknown setting", f"{trainer}: not a {trainer} setting", 1)
            raise UsageError(f"config {path}: {where}")
        data[trainer] = _enabled(path, section)
    return _enabled(path, data)


def _enabled(path: str | Path, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with each miles-style `disable_*` name turned into its setting."""
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
        if storage.is_remote(raw):  # an object-store root: its own settings object, if any
            root_url = storage.root_of(str(raw))
            assert isinstance(root_url, storage.ObjectRoot)
            if storage.get(root_url, DATA_SETTINGS) is not None:
                found.append(storage.object_path(root_url, DATA_SETTINGS))
            continue
        path = Path(raw)
        root = path if path.is_dir() else path.parent
        # Anything under the name is read (a FIFO or a folder there is refused, not passed over).
        if root.name.lower().startswith("step=") and not os.path.lexists(root / DATA_SETTINGS):
            root = root.parent
        if os.path.lexists(root / DATA_SETTINGS) and root / DATA_SETTINGS not in found:
            found.append(root / DATA_SETTINGS)
    return found


@dataclass(frozen=True)
class Given:
    """The settings given and where each came from (`sources`: a setting's name -> words
    naming its flag, file and key, or run config key)."""

    values: dict[str, Any]
    sources: dict[str, str]


def stacked(
    config: str | Path | None,
    data_configs: Sequence[Path],
    known: Sequence[str],
    sections: Mapping[str, Sequence[str]] = {},
    unset: Sequence[str] = (),
    source: str = "flag --{dashed}",
    default_trainer: str | None = None,
    **overrides: Any,
) -> Given:
    """The settings given: beside the data, then the YAML file, then explicit overrides
    (flags or run config, `source` words where: `{name}` or `{dashed}`), each above the one
    before; `known`: every setting's name. In each file the section of the chosen trainer
    (the `trainer` the stack gives) ranks above the file's other keys. `unset`: settings
    whose value from a file is dropped (back to its default), as `--unset NAME` asks."""
    layers = [
        (path, read_config(path, known, sections)) for path in [*data_configs, config] if path
    ]
    trainer = overrides.get("trainer")
    for _, data in reversed(layers):  # the file that ranks highest and names one
        if trainer is None and "trainer" in data:
            trainer = data["trainer"]
    trainer = default_trainer if trainer is None else trainer
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for path, data in layers:
        for name, value in data.items():
            if name not in sections:
                values[name], sources[name] = value, f"{path}, key {name}"
        own = data.get(trainer, {}) if isinstance(trainer, str) else {}
        for name, value in own.items():
            values[name], sources[name] = value, f"{path}, key {trainer}.{name}"
    for name in unset:
        if name not in known:
            raise UsageError(f"--unset {name}: {unknown_names([name], known)}")
        if overrides.get(name) is not None:
            raise UsageError(f"--unset {name} and a value for {name} given together: keep one")
        values.pop(name, None)
        sources.pop(name, None)
    for name, value in overrides.items():
        if value is not None:
            values[name] = value
            sources[name] = source.format(name=name, dashed=name.replace("_", "-"))
    return Given(values, sources)


# The settings a problem names: those it starts with (`a, b: ...`), and any `name=value`.
_LEADING = re.compile(r"^\s*([A-Za-z_]\w*(?:, [A-Za-z_]\w*)*): ")
_VALUED = re.compile(r"\b([A-Za-z_]\w*)=")


def sourced(problems: str, sources: Mapping[str, str]) -> str:
    """`problems` (`name: what`; ...) with where each named setting was given."""
    if not sources:
        return problems
    worded = []
    for problem in problems.split("; "):
        leading = _LEADING.match(problem)
        names = [*(leading.group(1).split(", ") if leading else []), *_VALUED.findall(problem)]
        given = [sources[name] for name in dict.fromkeys(names) if name in sources]
        worded.append(f"{problem} (given in {' and '.join(given)})" if given else problem)
    return "; ".join(worded)
