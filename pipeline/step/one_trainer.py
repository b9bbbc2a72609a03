"""Is an output root one dataset? Its steps built for one trainer (CONTRACT section 7).

The output root read whole (`datasets.load_dataset`, `pyarrow.dataset`, Ray Data) is the
training data, and each trainer's rank files carry columns of their own (slime's
`source_names`, verl's `group_index`), so steps built for two trainers in one root no
longer read as one table. A build for another trainer than the root's is refused: the CLI
before anything is read (every committed step looked at), and every path at the commit,
under the dataset card's lock (one other committed step looked at: each commit keeps the
root to one trainer).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline import trainers
from pipeline.io import writer
from pipeline.manifest import MANIFEST

RULE = "one_trainer_per_root"


def _trainer(folder: Path) -> str | None:
    """The trainer a committed step folder was built for (None: no manifest to read)."""
    try:
        settings = json.loads((folder / MANIFEST).read_bytes()).get("settings", {})
        trainer = settings.get("trainer", trainers.DEFAULT)  # manifests before `trainer`
    except (OSError, ValueError, AttributeError):
        return None
    return trainer if isinstance(trainer, str) else None


def other_trainer(out_root: Path, trainer: str, step: int | None = None) -> str | None:
    """Why `trainer`'s steps cannot go into `out_root` (committed steps of another trainer),
    or None. With `step` (a commit), one committed step other than `step` is looked at."""
    try:
        folders = sorted(p for p in out_root.glob("step=*") if (p / MANIFEST).is_file())
    except OSError:
        return None
    if step is not None:
        own = writer.step_folder(out_root, step)
        folders = [p for p in folders if p != own][:1]
    others: dict[str, list[str]] = {}
    for folder in folders:
        found = _trainer(folder)
        if found is not None and found != trainer:
            others.setdefault(found, []).append(folder.name)
    if not others:
        return None
    held = "; ".join(f"the {name} trainer's {_listed(names)}" for name, names in others.items())
    return (
        f"{out_root} holds steps built for another trainer ({held}), and a root read whole is "
        f"one dataset whose rank files have one set of columns: build the {trainer} trainer's "
        "shards into another --out (or remove those steps)"
    )


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more
