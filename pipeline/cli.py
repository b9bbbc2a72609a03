"""The command line: `rollout-shards build` and `rollout-shards validate` (CONTRACT section 4),
and `rollout-shards parity` (issue 7).

It runs the same stage functions as the Dagster assets and never imports Dagster.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pipeline.errors import StepError, UsageError, Violation, os_violation
from pipeline.io.readers import SourceFile, find_sources, group_steps
from pipeline.io.writer import clean_stale, step_folder
from pipeline.manifest import Manifest
from pipeline.progress import Progress
from pipeline.settings import (
    DISABLE_FLAGS,
    Settings,
    data_settings_files,
    load_settings,
    non_null,
    setting_fields,
    setting_types,
)
from pipeline.step.build import STAGE_NAMES, alarm_lines, build_step, summary_line
from pipeline.step.freshness import current_manifest
from pipeline.step.ingest import load_samples

PROG = "rollout-shards"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: usage error: {message} (see {PROG} --help)\n")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("settings (override the config file; named as miles' flags)")
    for name, annotation, help_text in setting_fields():
        if name in DISABLE_FLAGS:
            group.add_argument(
                _flag(DISABLE_FLAGS[name]),
                dest=name,
                action="store_false",
                default=argparse.SUPPRESS,
                help=f"turn off {name}",
            )
            continue
        base = non_null(annotation)
        if base is bool:
            group.add_argument(
                _flag(name),
                dest=name,
                action="store_true",
                default=argparse.SUPPRESS,
                help=help_text,
            )
        elif typing.get_origin(base) is typing.Literal:
            group.add_argument(
                _flag(name),
                dest=name,
                choices=typing.get_args(base),
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            group.add_argument(
                _flag(name),
                dest=name,
                type=typing.cast(Callable[[str], Any], base),
                metavar=name.upper(),
                default=argparse.SUPPRESS,
                help=help_text,
            )


def parser() -> argparse.ArgumentParser:
    root = _Parser(prog=PROG, description="Validated training shards from RL rollout tables.")
    commands = root.add_subparsers(dest="command", required=True, parser_class=_Parser)
    build = commands.add_parser("build", help="write training shards for every step found")
    build.add_argument("inputs", nargs="+", metavar="INPUT")
    build.add_argument("--out", required=True, type=Path, help="output root")
    build.add_argument(
        "--force",
        action="store_true",
        help="rebuild steps whose folder is already current (same inputs and settings)",
    )
    validate = commands.add_parser("validate", help="check inputs and settings, write nothing")
    validate.add_argument("inputs", nargs="+", metavar="INPUT")
    validate.add_argument("--format", choices=("text", "json"), default="text")
    for sub in (build, validate):
        sub.add_argument("--config", type=Path, help="settings YAML")
        sub.add_argument(
            "--session-version",
            choices=("v1", "v2"),
            help="session version of every row of miles .pt dumps (they do not store it)",
        )
        _add_setting_flags(sub)
    compare = commands.add_parser(
        "parity", help="compare two builds or two inputs field by field, bitwise"
    )
    compare.add_argument("left", metavar="A", help="output root, step folder or input")
    compare.add_argument("right", metavar="B", help="the same kind as A")
    compare.add_argument("--format", choices=("text", "json"), default="text")
    return root


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


def _report(command: str, violations: list[Violation]) -> None:
    for violation in violations:
        print(f"{PROG}: {command}: {violation.line()}", file=sys.stderr)


def _warn(command: str, manifest: Manifest) -> None:
    from pipeline.step.plan import untrained_warning  # numpy: loaded while a build reads

    if (warning := untrained_warning(manifest)) is not None:
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
        manifest = build_step(
            step, sources, settings, args.out, force=True, reporter=progress, skipped=skipped
        )
    except StepError as exc:
        progress.step_done()
        for violation in exc.violations:
            violation.step = step if violation.step is None else violation.step
        _report("build", exc.violations)
        return False
    except OSError as exc:
        progress.step_done()
        _report("build", [os_violation(exc, args.out, step)])
        return False
    progress.step_done()
    print(summary_line(manifest, step_folder(args.out, step)))
    for line in alarm_lines(manifest):
        print(line)
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
    from pipeline.step.plan import plan_batch

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
                _report("validate", entry["violations"])
    return 0 if all(entry["valid"] for entry in report) else 1


def run_parity(args: argparse.Namespace) -> int:
    from pipeline.parity import parity

    report = parity(args.left, args.right)
    if args.format == "json":
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.text())
    return 0 if report.identical else 1


def _run(args: argparse.Namespace) -> int:
    commands = {"build": run_build, "validate": run_validate, "parity": run_parity}
    try:
        return commands[args.command](args)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except UsageError as exc:
        print(f"{PROG}: usage error: {exc}", file=sys.stderr)
        return 2
    except StepError as exc:
        _report(args.command, exc.violations)
        return 1
    except OSError as exc:
        _report(args.command, [os_violation(exc, Path(getattr(args, "out", None) or "."))])
        return 1


def exit_now(status: int) -> NoReturn:
    """End the program without the interpreter's teardown (freeing every frame and module
    takes a tenth of a second or more after a big step). By now every step folder is
    committed and fsynced and every thread pool is joined; only the output streams may
    hold text, and they are flushed first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
            status = status or 1
    os._exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    """The program (`rollout-shards`). Called with `argv` it returns the exit status (tests,
    other Python code); as the program itself (no `argv`) it exits when done."""
    args = parser().parse_args(argv)
    status = _run(args)
    if argv is None:
        exit_now(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
