"""The record a refused step leaves in the output root, so a trainer waiting on it fails at
once with the reason instead of waiting for a step that will not come.

A build that refuses a step (its data breaks a rule, or its settings cannot be met) writes
nothing of the step, but `<root>/_refused/step=<N>.json`: the broken rules and their rows,
the input files with their sha256, the settings and when. It is written atomically
(`writer.write_text_atomically`) and removed by the next build that commits the step or
finds it current. Under `_refused/`, like `_quarantine/`, it is no part of the dataset
(readers skip names starting with `_`). The loader (`rollout_shards_loader._step`) reads it
in `wait_for_step`; `rollout-shards validate <output root>` prints it whole.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from pipeline.errors import StepError, printable
from pipeline.io import writer
from pipeline.io.checksums import input_digest
from pipeline.io.discovery import SourceFile
from pipeline.manifest import input_path

REFUSED_FOLDER = "_refused"
# Failures of the machine, not of the step's data or settings: the step may build on the
# next try, so no trainer is told it was refused.
NOT_REFUSALS = frozenset({"os_error", "ray_tasks"})
PROG = "rollout-shards"


def record_path(out_root: Path, step: int) -> Path:
    """Where a refused step's record is: `<root>/_refused/step=<N>.json`."""
    return out_root / REFUSED_FOLDER / f"step={step}.json"


def write_record(
    out_root: Path,
    step: int,
    error: StepError,
    sources: Sequence[SourceFile],
    settings: Any,
) -> Path | None:
    """Record why `step` was refused (None, and nothing written, for a machine's failure)."""
    if not error.violations or {v.rule for v in error.violations} <= NOT_REFUSALS:
        return None
    violations = [v if v.step is not None else replace(v, step=step) for v in error.violations]
    record = {
        "step": step,
        "refused_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "lines": [v.line() for v in violations],
        "violations": [asdict(v) for v in violations],
        "inputs": [
            {"path": input_path(source.path), "sha256": input_digest(source.path)}
            for source in sources
        ],
        "settings": settings.to_dict() if hasattr(settings, "to_dict") else {},
        "shown_by": f"{PROG} validate {out_root.resolve()}",
    }
    path = record_path(out_root, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_text_atomically(path, json.dumps(record, indent=2, default=str) + "\n")
    return path


def clear_record(out_root: Path, step: int) -> None:
    """The step is committed (or current): it is no longer refused."""
    record_path(out_root, step).unlink(missing_ok=True)


def refused_steps(out_root: Path) -> dict[int, dict[str, Any]]:
    """The records under an output root by step (an unreadable one as its bare lines)."""
    found: dict[int, dict[str, Any]] = {}
    for path in sorted((out_root / REFUSED_FOLDER).glob("step=*.json")):
        digits = path.stem.removeprefix("step=")
        if not digits.isdigit():
            continue
        try:
            record = json.loads(path.read_text())
            lines = record["lines"]
            assert isinstance(lines, list)
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            record = {"lines": [f"step {digits}: {path}: a refusal record that cannot be read"]}
        found[int(digits)] = {**record, "path": str(path)}
    return dict(sorted(found.items()))


def is_output_root(path: Path) -> bool:
    """Whether `path` is a rollout-shards output root (committed or refused steps in it)."""
    if not path.is_dir():
        return False
    return (path / REFUSED_FOLDER).is_dir() or any(path.glob("step=*/manifest.json"))


def report_root(command: str, out_root: Path) -> bool:
    """`validate <output root>`: each refused step's lines on stderr and where its record
    is, each committed step in one line on stdout; True when no step is refused."""
    import sys

    refused = refused_steps(out_root)
    committed = sorted(
        int(p.parent.name.removeprefix("step="))
        for p in out_root.glob("step=*/manifest.json")
        if p.parent.name.removeprefix("step=").isdigit()
    )
    for step in committed:
        if step not in refused:
            print(f"step {step}: built -> {printable(str(writer.step_folder(out_root, step)))}")
    for step, record in refused.items():
        for line in record["lines"]:
            print(f"{PROG}: {command}: {printable(str(line))}", file=sys.stderr)
        when = record.get("refused_at", "an unknown time")
        older = " (an older build stands in its folder)" if step in committed else ""
        print(
            f"step {step}: refused by its build at {when}{older}: "
            f"{printable(record['path'])} holds its rules, rows, inputs and settings"
        )
    return not refused


def refused_notes(command: str, out_root: Path) -> list[str]:
    """One line per refused step of an output root, for commands that list its steps."""
    return [
        f"{PROG}: {command}: note: step {step} was refused by its build ("
        f"{printable(str(record['lines'][0]))}): `{PROG} validate {out_root}` shows it all"
        for step, record in refused_steps(out_root).items()
        if record["lines"]
    ]
