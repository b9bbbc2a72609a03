"""Where rollout tables are read and training shards written, and the settings file.

The roots come from the environment (`ROLLOUT_SHARDS_INPUT`, `ROLLOUT_SHARDS_OUTPUT`,
`ROLLOUT_SHARDS_CONFIG`). A launch may narrow a root to a sub-folder in run config (say
`output_root: dp4` for a one-off build with other settings), but every path given there
resolves inside the configured roots; anything else is refused before a file is touched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from pipeline.errors import UsageError
from pipeline.io.discovery import STEP_FOLDER, SourceFile
from pipeline.settings import Settings, data_settings_files, load_settings
from pipeline.step.roots import StepRoots

INPUT_ENV = "ROLLOUT_SHARDS_INPUT"
OUTPUT_ENV = "ROLLOUT_SHARDS_OUTPUT"
CONFIG_ENV = "ROLLOUT_SHARDS_CONFIG"
DEFAULT_INPUT = "data/rollouts"
DEFAULT_OUTPUT = "data/shards"


def configured_input_root() -> Path:
    return Path(os.environ.get(INPUT_ENV) or DEFAULT_INPUT).resolve()


def configured_output_root() -> Path:
    return Path(os.environ.get(OUTPUT_ENV) or DEFAULT_OUTPUT).resolve()


def configured_settings_file() -> Path | None:
    value = os.environ.get(CONFIG_ENV)
    return Path(value).resolve() if value else None


def inside(root: Path, value: str, what: str) -> Path:
    """`value` resolved against `root` (symlinks followed); refused unless it stays inside."""
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
    def input_path(self) -> Path:
        root = configured_input_root()
        return inside(root, self.input_root, "input_root") if self.input_root else root

    @property
    def output_path(self) -> Path:
        root = configured_output_root()
        if not self.output_root:
            return root
        path = inside(root, self.output_root, "output_root")
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
        return inside(configured_input_root(), self.config, "config")

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

    def staging_folder(self, asset: str, step: int) -> Path:
        return self.roots().staging_folder(asset, step)
