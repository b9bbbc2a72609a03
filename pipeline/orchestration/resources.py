"""Where rollout tables are read and training shards written, and the settings file.

The roots come from the environment (`ROLLOUT_SHARDS_INPUT`, `ROLLOUT_SHARDS_OUTPUT`,
`ROLLOUT_SHARDS_CONFIG`). A launch may narrow a root to a sub-folder in run config (say
`output_root: dp4` for a one-off build with other settings), but every path given there
resolves inside the configured roots; anything else is refused before a file is touched.
A root may be an object store (`s3://bucket/prefix`, docs/deploy.md "Object storage"): a
sub-folder in run config is then a key prefix under it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from pipeline.errors import UsageError
from pipeline.io.discovery import STEP_FOLDER, SourceFile
from pipeline.io.storage import ObjectRoot, root_of
from pipeline.manifest import Manifest
from pipeline.orchestration.stored_steps import committed_step, manifest_of
from pipeline.settings import Settings, data_settings_files, load_settings
from pipeline.step.roots import StepRoots

INPUT_ENV = "ROLLOUT_SHARDS_INPUT"
OUTPUT_ENV = "ROLLOUT_SHARDS_OUTPUT"
CONFIG_ENV = "ROLLOUT_SHARDS_CONFIG"
DEFAULT_INPUT = "data/rollouts"
DEFAULT_OUTPUT = "data/shards"


def _configured(name: str, default: str) -> Path | ObjectRoot:
    root = root_of(os.environ.get(name) or default)
    return root.resolve() if isinstance(root, Path) else root


def configured_input_root() -> Path | ObjectRoot:
    return _configured(INPUT_ENV, DEFAULT_INPUT)


def configured_output_root() -> Path | ObjectRoot:
    return _configured(OUTPUT_ENV, DEFAULT_OUTPUT)


def configured_settings_file() -> Path | None:
    value = os.environ.get(CONFIG_ENV)
    return Path(value).resolve() if value else None


def inside_store(root: ObjectRoot, value: str, what: str) -> ObjectRoot:
    """`value` (the root's URL, a URL under it, or a key prefix) as a root under `root`;
    refused unless it stays inside, or when it names a step's own prefix."""
    rest = value.removeprefix(root.uri) if value.startswith(root.uri) else value
    parts = [part for part in rest.split("/") if part]
    escapes = "://" in rest or (rest and value.startswith(root.uri) and not rest.startswith("/"))
    if escapes or any(part in (".", "..") for part in parts):
        raise UsageError(
            f"{what} {value} is not a prefix inside the configured root {root}; "
            "paths in run config must stay inside it"
        )
    for part in parts:
        if STEP_FOLDER.match(part):
            raise UsageError(
                f"{what} {value} lies inside the step prefix {part} of {root}; "
                "choose a prefix of its own"
            )
    return ObjectRoot("/".join([root.uri, *parts]))


def inside(root: Path | ObjectRoot, value: str, what: str) -> Path | ObjectRoot:
    """`value` resolved against `root` (symlinks followed); refused unless it stays inside."""
    if isinstance(root, ObjectRoot):
        return inside_store(root, value, what)
    path = (root / value).resolve()
    if not path.is_relative_to(root):
        raise UsageError(
            f"{what} {value} resolves to {path}, outside the configured root {root}; "
            "paths in run config must stay inside it"
        )
    return path


class RolloutStorage(dg.ConfigurableResource):
    """Input root, output root and settings file of this deployment."""

    input_root: str | None = Field(
        default=None,
        description=f"Rollout tables; inside ${INPUT_ENV} (default {DEFAULT_INPUT}).",
    )
    output_root: str | None = Field(
        default=None,
        description=f"Training shards; inside ${OUTPUT_ENV} (default {DEFAULT_OUTPUT}).",
    )
    config: str | None = Field(
        default=None,
        description=f"Settings YAML: ${CONFIG_ENV}, or a file inside the input root.",
    )

    @classmethod
    def from_env(cls) -> RolloutStorage:
        """The configured roots as absolute paths, so the UI shows where data goes."""
        settings_file = configured_settings_file()
        return cls(
            input_root=str(configured_input_root()),
            output_root=str(configured_output_root()),
            config=str(settings_file) if settings_file else None,
        )

    @property
    def input_path(self) -> Path | ObjectRoot:
        root = configured_input_root()
        return inside(root, self.input_root, "input_root") if self.input_root else root

    @property
    def output_path(self) -> Path | ObjectRoot:
        root = configured_output_root()
        if not self.output_root:
            return root
        path = inside(root, self.output_root, "output_root")
        if isinstance(path, ObjectRoot) or isinstance(root, ObjectRoot):
            return path
        # A root inside a committed step folder would put shards among another step's.
        for folder in [path, *path.parents]:
            if folder == root:
                break
            if STEP_FOLDER.match(folder.name) and (folder / "manifest.json").exists():
                raise UsageError(
                    f"output_root {self.output_root} resolves to {path}, inside the committed "
                    f"step folder {folder}; choose a folder of its own under {root}"
                )
        return path

    @property
    def settings_path(self) -> Path | None:
        if self.config is None:
            return None
        configured = configured_settings_file()
        if configured is not None and Path(self.config).resolve() == configured:
            return configured
        root = configured_input_root()
        if isinstance(root, ObjectRoot):
            raise UsageError(
                f"config {self.config}: with the input root in an object store ({root}), the "
                f"settings file is ${CONFIG_ENV} or the root's own rollout-shards.yaml"
            )
        path = inside(root, self.config, "config")
        assert isinstance(path, Path)
        return path

    def settings(self, overrides: dict[str, Any] | None = None) -> Settings:
        """Defaults, the input root's `rollout-shards.yaml`, the settings file, then run config."""
        data_configs = data_settings_files([self.input_path])
        return load_settings(
            self.settings_path,
            data_configs,
            source="run config key {name}",
            **(overrides or {}),
        )

    def roots(self) -> StepRoots:
        """The checked roots as plain paths, for the stages in process or in a Pipes worker."""
        return StepRoots(input_root=self.input_path, output_root=self.output_path)

    def steps(self) -> dict[int, list[SourceFile]]:
        """Every complete step under the input root with its files in batch order."""
        return self.roots().steps(self.settings().require_success_marker)

    def step_sources(self, step: int) -> list[SourceFile]:
        return self.roots().step_sources(step)

    def step_folder(self, step: int) -> Path:
        return self.roots().step_folder(step)

    def manifest(self, step: int) -> Manifest | None:
        """The committed manifest of `step` under the output root (local or in a store)."""
        return manifest_of(self.output_path, step)

    def committed_step(self, step: int) -> tuple[Path, Manifest | None]:
        """Where the checks read the step's files, and its manifest (`stored_steps`)."""
        return committed_step(self.output_path, step)

    def staging_folder(self, asset: str, step: int) -> Path:
        return self.roots().staging_folder(asset, step)
