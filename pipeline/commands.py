"""What the command line runs: `build`, `validate` and `parity` on parsed arguments.

`pipeline.cli` parses the arguments and imports this module (Polars with it) only then, so
that a usage error needs no heavy import and the process settings are in place first.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.errors import StepError, UsageError, Violation, os_violation, printable
from pipeline.io.discovery import SourceFile, find_sources
from pipeline.io.load import group_steps
from pipeline.io.storage import ObjectRoot, check_reachable, is_remote, root_of
from pipeline.io.writer import clean_stale, step_folder
from pipeline.json_text import strict_json
from pipeline.manifest import Manifest
from pipeline.progress import Progress
from pipeline.root_commands import run_metrics, run_parity, run_report
from pipeline.settings import (
    RowSettings,
    Settings,
    data_settings_files,
    given_settings,
    make_row_settings,
    make_settings,
    setting_types,
)
from pipeline.settings_files import Given
from pipeline.step import ROLLOUT_SAMPLES, TRAIN_BATCH, refused
from pipeline.step.build import (
    STAGE_NAMES,
    StepJob,
    build_step,
    quarantine_lines,
    run_step,
    summary_line,
    warning_lines,
)
from pipeline.step.one_trainer import other_trainer
from pipeline.step.plan import plan_batch
from pipeline.step.ray_route import Route, ray_route
from pipeline.step.tables import SampleTable, TrainBatch

PROG = "rollout-shards"


# validate without a global batch size: what it checks, and what would check the rest.
ROWS_ONLY = (
    "no global_batch_size given (--global-batch-size, --config, or rollout-shards.yaml in "
    "the input root): the row and file rules are checked; give --global-batch-size "
    "(and --dp-size and the other batch settings) to check trimming, the batch layout and "
    "the ranks too; build needs it"
)


def _given(args: argparse.Namespace) -> Given:
    """The settings the command line gives: its files (`--config`, each input root's own)
    less what `--unset` drops, then its flags; each with where it came from."""
    names = set(setting_types())
    overrides = {k: v for k, v in vars(args).items() if k in names}
    unset = [name.replace("-", "_") for name in getattr(args, "unset", [])]
    return given_settings(args.config, data_settings_files(args.inputs), unset, **overrides)


def _settings(args: argparse.Namespace) -> Settings:
    given = _given(args)
    return make_settings(given.values, given.sources)


def _inputs_exist(inputs: Sequence[str]) -> None:
    """A missing input is the first thing to say (before any setting it would need)."""
    for raw in inputs:
        if is_remote(raw):
            root = root_of(raw)
            assert isinstance(root, ObjectRoot)
            check_reachable(root, "input")
        elif not os.path.lexists(raw):
            raise UsageError(f"input {raw} does not exist")


def _steps(
    inputs: Sequence[str],
    settings: Settings | RowSettings,
    session_version: str | None = None,
    skipped: list[Path] | None = None,
    refused: list[Violation] | None = None,
) -> dict[int, list[SourceFile]]:
    """The steps under the inputs; paths refused by name (a step beyond int64, a folder
    named like a dump) go to `refused`, for the caller to report beside the built steps."""
    notes: list[str] = []
    incomplete: list[Path] = []
    sources = find_sources(
        inputs,
        session_version,
        notes,
        skipped,
        settings.require_success_marker,
        incomplete,
        refused,
    )
    steps = group_steps(sources)
    for note in notes:
        print(f"{PROG}: note: {printable(note)}", file=sys.stderr)
    if not steps and not incomplete and not refused:
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
    try:
        str(out.resolve()).encode("utf-8")
    except UnicodeEncodeError:  # Polars takes UTF-8 paths only: it could not write there
        raise UsageError(
            f"--out {out} has a name that is not UTF-8 text: choose an output folder whose "
            "path is UTF-8"
        ) from None
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
    route: Route | None = None,
) -> bool:
    """Build one step unless it is current; False (after printing why) when it fails."""
    report = _StepReport(progress)
    try:
        manifest = build_step(
            step,
            sources,
            settings,
            args.out,
            args.force,
            reporter=report,
            skipped=skipped,
            early=args.early_digests,
            route=route,
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
    if report.current is not None:
        print(
            f"step {step}: up to date, skipped: {printable(str(report.current))} was built "
            "from the same inputs and settings (--force rebuilds it)"
        )
        return True
    folder = args.out.url(f"step={step}") if is_remote(args.out) else step_folder(args.out, step)
    print(printable(summary_line(manifest, folder)))
    for line in quarantine_lines(manifest, args.out):
        print(f"{PROG}: build: {printable(line)}", file=sys.stderr)
    _warn("build", manifest)
    return True


class _StepReport:
    """The progress of one step's build, and whether its folder was current."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.current: Path | str | None = None

    def begin(self, step: int, stage: str) -> None:
        self.progress.begin(step, stage)

    def end(self, step: int, stage: str, detail: str) -> None:
        self.progress.end(step, stage, detail)

    def up_to_date(self, step: int, folder: Path | str) -> None:
        self.current = folder


def skipped_files(skipped: Sequence[Path], step: int) -> list[str]:
    """The skipped look-alike files a step's manifest lists: those whose name carries
    this step (in any case), and those naming no step at all."""
    kept = []
    for path in skipped:
        named = re.findall(r"(?i)step=([0-9]+)", str(path))
        if not named or int(named[-1]) == step:
            kept.append(str(path))
    return kept


def run_build(args: argparse.Namespace) -> int:
    _inputs_exist(args.inputs)
    settings = _settings(args)
    if is_remote(args.out):
        check_reachable(args.out, "--out")
    else:
        check_out(args.out, args.inputs)
        if (mixed := other_trainer(args.out, settings.trainer)) is not None:
            raise UsageError(mixed)  # the root read whole is one dataset
        clean_stale(args.out)
    skipped: list[Path] = []
    by_name: list[Violation] = []
    steps = _steps(args.inputs, settings, args.session_version, skipped, by_name)
    print_violations("build", by_name)
    progress = Progress(len(steps), STAGE_NAMES, quiet=args.quiet)
    # --ray ADDRESS: the steps above ray_above are built by tasks on that cluster
    with ray_route(settings) as route:
        built = [
            _build_one(step, files, settings, args, progress, skipped_files(skipped, step), route)
            for step, files in steps.items()
        ]
    return 0 if all(built) and not by_name else 1


def _validate_one(
    step: int,
    sources: list[SourceFile],
    settings: Settings | RowSettings,
    args: argparse.Namespace,
    progress: Progress,
    report: list[dict[str, Any]],
    route: Route | None,
) -> None:
    """One step's entry of `validate`'s report: the build's own driver, stopped before the
    write (rows only: after the read), on the cluster when `route` sends it there."""
    job = StepJob(step, sources, settings, None, early=args.early_digests)
    if route is not None:
        job = route(job)
    last = TRAIN_BATCH if isinstance(settings, Settings) else ROLLOUT_SAMPLES
    try:
        for _, value in run_step(job, last=last, reporter=_StepReport(progress)):
            if isinstance(value, SampleTable):
                samples = value
            elif isinstance(value, TrainBatch):
                counts = value.meta
                _warn("validate", counts)
    except StepError as exc:
        progress.step_done()
        report.append({"step": step, "valid": False, "violations": exc.violations})
        return
    progress.step_done()
    entry: dict[str, Any] = {"step": step, "valid": True, "violations": []}
    if isinstance(settings, Settings):
        entry["counts"] = counts.counts.to_dict()
    else:
        quarantined = samples.quarantine.height if samples.quarantine is not None else 0
        entry["counts"] = {"ingested": samples.ingested, "quarantined": quarantined}
    report.append(entry)


def run_validate(args: argparse.Namespace) -> int:
    _inputs_exist(args.inputs)
    if all(refused.is_output_root(Path(raw)) for raw in args.inputs):
        # an output root: its refused steps (the records builds left), whole
        shown = [refused.report_root("validate", Path(raw)) for raw in args.inputs]  # each
        return 0 if all(shown) else 1
    given = _given(args)
    # the trainer checks its batch once the settings it needs are given (miles: a global
    # batch size); without them the rows alone, every other setting checked as `build` would
    settings: Settings | RowSettings | None = make_row_settings(given.values, given.sources)
    if settings is None:
        settings = make_settings(given.values, given.sources)
    else:
        print(f"{PROG}: note: {ROWS_ONLY}", file=sys.stderr)
    by_name: list[Violation] = []
    steps = _steps(args.inputs, settings, args.session_version, refused=by_name)
    report: list[dict[str, Any]] = [
        {"step": violation.step, "valid": False, "violations": [violation]} for violation in by_name
    ]
    stages = STAGE_NAMES[:2] if isinstance(settings, Settings) else STAGE_NAMES[:1]
    progress = Progress(len(steps), stages, quiet=args.quiet)
    # --ray ADDRESS: the steps above ray_above are read and checked by tasks on that cluster
    with ray_route(settings) as route:
        for step, sources in steps.items():
            _validate_one(step, sources, settings, args, progress, report, route)
    if args.format == "json":
        for entry in report:
            entry["violations"] = [v.__dict__ for v in entry["violations"]]
        print(strict_json(report))
    else:
        for entry in report:
            if not entry["valid"]:
                print_violations("validate", entry["violations"])
                continue
            n, step = entry["counts"], entry["step"]
            if "written" in n:
                print(f"step {step}: valid, {n['ingested']} rows, {n['written']} would be written")
            else:
                print(f"step {step}: rows valid, {n['ingested']} rows (batch not checked)")
    return 0 if all(entry["valid"] for entry in report) else 1


def run_plan(args: argparse.Namespace) -> int:
    """Every step read and checked once, then planned under each layout of the grid."""
    from pipeline import planner

    _inputs_exist(args.inputs)
    layouts = [
        (_settings(given), {name: getattr(given, name) for name in args.varying})
        for given in args.layouts
    ]
    first = layouts[0][0]
    by_name: list[Violation] = []
    steps = _steps(args.inputs, first, args.session_version, refused=by_name)
    print_violations("plan", by_name)
    plans: list[planner.LayoutPlan] = []
    failed = bool(by_name)
    progress = Progress(len(steps), STAGE_NAMES[:2], quiet=args.quiet)
    for step, sources in steps.items():
        # the layout settings are not the check's: one read and check serves every layout
        job = StepJob(step, sources, first, None, early=args.early_digests)
        try:
            samples = next(
                v for _, v in run_step(job, last=ROLLOUT_SAMPLES, reporter=_StepReport(progress))
            )
        except StepError as exc:
            progress.step_done()
            print_violations("plan", exc.violations)
            failed = True
            continue
        assert isinstance(samples, SampleTable)
        for settings, layout in layouts:
            try:
                batch = plan_batch(samples, settings)
            except StepError as exc:
                line = "; ".join(v.line() for v in exc.violations)
                plans.append(planner.LayoutPlan(step, layout, None, refused=line))
                continue
            plans.append(planner.LayoutPlan(step, layout, planner.rank_figures(batch, settings)))
        progress.step_done()
    measure = args.by or planner.default_measure(plans)
    if args.format == "json":
        print(strict_json([p.to_json() for p in plans]))
    else:
        print(planner.text_table(plans, measure))
    return 1 if failed else 0


COMMANDS = {
    "build": run_build,
    "validate": run_validate,
    "plan": run_plan,
    "parity": run_parity,
    "metrics": run_metrics,
    "report": run_report,
}
