"""The resolved roots of one build: where a step's tables are and where its folders go.

Plain paths, no Dagster: the `rollout_storage` resource checks run config against the
configured roots and hands these on, in process or to a Pipes worker on another machine.
Either root may be an object store (`ObjectRoot`, `s3://bucket/prefix`): its steps come
from one listing, its step is committed by `store_commit`, and it has no staging area.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UsageError, printable
from pipeline.io import writer
from pipeline.io.discovery import SourceFile, find_sources
from pipeline.io.load import group_steps
from pipeline.io.storage import ObjectRoot, check_reachable, object_path, root_of

# Intermediate assets live under the output root, beside the step folders but hidden from
# a trainer that looks for `step=<N>/`.
STAGING = ".staging"


@dataclass(frozen=True)
class StepRoots:
    """Input root (rollout tables) and output root (step folders and staging)."""

    input_root: Path | ObjectRoot
    output_root: Path | ObjectRoot

    def steps(self, require_marker: bool = False) -> dict[int, list[SourceFile]]:
        """Every step under the input root with its files in batch order (with
        `require_marker`, only step folders holding `_SUCCESS`)."""
        if isinstance(self.input_root, ObjectRoot):
            check_reachable(self.input_root, "input root")
        elif not self.input_root.is_dir():
            raise UsageError(f"input root {self.input_root} is not a folder")
        found = find_sources([str(self.input_root)], require_marker=require_marker)
        return group_steps(found)

    def step_sources(self, step: int) -> list[SourceFile]:
        sources = self.steps().get(step)
        if not sources:
            raise UsageError(f"no rollout tables for step {step} under {self.input_root}")
        return sources

    def step_folder(self, step: int) -> Path:
        """The step's folder; in an object store its prefix's URL (`ObjectPath`)."""
        if isinstance(self.output_root, ObjectRoot):
            return object_path(self.output_root, f"step={step}")
        return writer.step_folder(self.output_root, step)

    def staging_folder(self, asset: str, step: int) -> Path:
        """Where `asset` of `step` is staged, inside the output root. A symbolic link on the
        way (`.staging` or an asset's folder pointing elsewhere) would put staged samples
        outside the output root: it is refused like any path that escapes it. An object
        store has no staging area: a stage staged there would need a rename to replace it
        safely, so a subset of the three assets is refused in one line."""
        if isinstance(self.output_root, ObjectRoot):
            raise UsageError(
                f"step {step}: {asset} would be staged, but the output root "
                f"{self.output_root} is an object store, which keeps no staged assets: "
                "materialize the three assets of the step together"
            )
        folder = self.output_root / STAGING / asset / f"step={step}"
        for part in (folder.parent.parent, folder.parent, folder):
            if part.is_symlink():
                raise UsageError(
                    f"{printable(str(part))} is a symbolic link to "
                    f"{printable(str(part.readlink()))}: staged data must stay inside the "
                    f"output root {printable(str(self.output_root))}; remove the link"
                )
        return folder

    def to_json(self) -> dict[str, str]:
        return {"input_root": str(self.input_root), "output_root": str(self.output_root)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRoots:
        return cls(input_root=root_of(data["input_root"]), output_root=root_of(data["output_root"]))
