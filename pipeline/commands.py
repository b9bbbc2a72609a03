"""What the command line runs: `build`, `validate` and `parity` on parsed arguments.

`pipeline.cli` parses the arguments and imports this module (Polars with it) only then, so
that a usage error needs no heavy import and the process settings are in place first.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.errors import StepError, UsageError, Violation, os_violation
from pipeline.io.readers import SourceFile, find_sources, group_steps
from pipeline.io.writer import clean_stale, step_folder
from pipeline.manifest import Manifest
from pipeline.progress import Progress
from pipeline.settings import Settings, data_settings_files, load_settings, setting_types
from pipeline.step.build import STAGE_NAMES, build_step, summary_line, warning_lines
from pipeline.step.freshness import current_manifest
from pipeline.step.ingest import load_samples
from pipeline.step.plan import plan_batch

PROG = "rollout-shards"


def _settings(args: argparse.Namespace) -> Settings:
    names = set(setting_types())
    overrides = {k: v for k, v in vars(args).items() if k in names}
    return load_settings(args.config, data_settings_files(args.inputs), **overrides)


def _steps(
    inputs: Sequence[str], session_version: str | None = None, skipped: list[Path] | None = None
) -> dict[int, list[SourceFile]]:
    notes: list[str] = []
    steps = group_steps(find_sources(inputs, session_version, notes, skipped))
    for note in notes:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    if not steps:
        raise UsageError(f"no rollout tables found under {', '.join(inputs)}")
    return steps


def print_violations(command: str, violations: list[Violation]) -> None:
    for violation in violations:
        print(f"{PROG}: {command}: {violation.line()}", file=sys.stderr)


def _warn(command: str, manifest: Manifest) -> None:
    """A step's warnings (alarming rollout metrics, untrained rows), on stderr."""
    for warning in warning_lines(manifest):
        print(f"{PROG}: {command}: {warning}", file=sys.stderr)


def check_out(out: Path, inputs: Sequence[str]) -> None:
    """The output root must be a folder apart from every input: a build reading its own
    shards, or writing into the data it reads, is a usage error."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    resolved = out.resolve()
    for raw in inputs:
        root = Path(raw).resolve()
        if resolved == root or resolved.is_relative_to(root):
            raise UsageError(f"--out {out} is inside the input {raw}: choose a folder outside it")
        if root.is_relative_to(resolved):
            raise UsageError(f"the input {raw} is inside --out {out}: choose a folder apart")


def _build_one(
    step: int,
    sources: list[SourceFile],
    settings: Settings,
    args: argparse.Namespace,
    progress: Progress,
    skipped: list[str],
) -> bool:
    """Build one step unless it is current; False (after printing why) when it fails."""
    try:
        current = None if args.force else current_manifest(step, sources, settings, args.out)
        if current is not None:
            progress.step_done()
            print(
                f"step {step}: up to date, skipped: {args.out / f'step={step}'} was built from "
                "the same inputs and settings (--force rebuilds it)"
            )
            return True
        # checked again under the step's lock: another build may publish it meanwhile
        manifest = build_step(
            step, sources, settings, args.out, args.force, reporter=progress, skipped=skipped
        )
    except StepError as exc:
        progress.step_done()
        for violation in exc.violations:
            violation.step = step if violation.step is None else violation.step
        print_violations("build", exc.violations)
        return False
    except OSError as exc:
        progress.step_done()
        print_violations("build", [os_violation(exc, args.out, step)])
        return False
    progress.step_done()
    print(summary_line(manifest, step_folder(args.out, step)))
    _warn("build", manifest)
    return True


def skipped_files(skipped: Sequence[Path], step: int) -> list[str]:
    """The skipped look-alike files a step's manifest lists: those whose name carries
    this step (in any case), and those naming no step at all."""
    kept = []
    for path in skipped:
        named = re.findall(r"(?i)step=(\d+)", str(path))
        if not named or int(named[-1]) == step:
            kept.append(str(path))
    return kept


def run_build(args: argparse.Namespace) -> int:
    settings = _settings(args)
    check_out(args.out, args.inputs)
    clean_stale(args.out)
    skipped: list[Path] = []
    steps = _steps(args.inputs, args.session_version, skipped)
    progress = Progress(len(steps), STAGE_NAMES)
    built = [
        _build_one(step, files, settings, args, progress, skipped_files(skipped, step))
        for step, files in steps.items()
    ]
    return 0 if all(built) else 1


def run_validate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    report: list[dict[str, Any]] = []
    steps = _steps(args.inputs, args.session_version)
    # JSON output is for machines: no progress lines mixed into it.
    progress = Progress(len(steps), STAGE_NAMES[:2], quiet=args.format == "json")
    for step, sources in steps.items():
        try:
            progress.begin(step, STAGE_NAMES[0])
            samples = load_samples(step, sources, settings)
            progress.end(step, STAGE_NAMES[0], f"{samples.ingested} rows read")
            progress.begin(step, STAGE_NAMES[1])
            batch = plan_batch(samples, settings)
        except StepError as exc:
            progress.step_done()
            report.append({"step": step, "valid": False, "violations": exc.violations})
            continue
        progress.step_done()
        _warn("validate", batch.meta)
        report.append(
            {
                "step": step,
                "valid": True,
                "violations": [],
                "counts": batch.meta.counts.to_dict(),
            }
        )
    if args.format == "json":
        for entry in report:
            entry["violations"] = [v.__dict__ for v in entry["violations"]]
        print(json.dumps(report, indent=2))
    else:
        for entry in report:
            if entry["valid"]:
                n = entry["counts"]
                step = entry["step"]
                print(f"step {step}: valid, {n['ingested']} rows, {n['written']} would be written")
            else:
                print_violations("validate", entry["violations"])
    return 0 if all(entry["valid"] for entry in report) else 1


def run_parity(args: argparse.Namespace) -> int:
    from pipeline.parity import parity

    report = parity(args.left, args.right)
    if args.format == "json":
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.text())
    return 0 if report.identical else 1


def run_metrics(args: argparse.Namespace) -> int:
    from pipeline import metrics_export

    if args.tensorboard is None and args.jsonl is None:
        raise UsageError("metrics: give --tensorboard DIR, --jsonl FILE or both")
    steps = metrics_export.root_metrics(args.root)
    written = []
    if args.tensorboard is not None:
        written.append(str(metrics_export.write_tensorboard(steps, args.tensorboard)))
    if args.jsonl == "-":
        sys.stdout.write(metrics_export.jsonl_text(steps))
        return 0
    if args.jsonl is not None:
        metrics_export.write_jsonl(steps, Path(args.jsonl))
        written.append(args.jsonl)
    first, last = steps[0].step, steps[-1].step
    span = f"step {first}" if len(steps) == 1 else f"{len(steps)} steps ({first}..{last})"
    print(f"{PROG}: metrics: {span} of {args.root} to {' and '.join(written)}")
    return 0


COMMANDS = {
    "build": run_build,
    "validate": run_validate,
    "parity": run_parity,
    "metrics": run_metrics,
}
