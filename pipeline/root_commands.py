"""The commands that read what is built or given, and build nothing: `parity` (two builds
or two inputs), `metrics` (an output root's rollout metrics) and `report` (its index)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.errors import PROG, UsageError
from pipeline.io.storage import is_remote
from pipeline.json_text import strict_json
from pipeline.step import refused


def run_parity(args: argparse.Namespace) -> int:
    from pipeline.parity.payloads import parity

    report = parity(args.left, args.right)
    if args.format == "json":
        print(strict_json(report.to_json()))
    else:
        print(report.text())
    return 0 if report.identical else 1


def run_metrics(args: argparse.Namespace) -> int:
    from pipeline import metrics_export

    jsonl = None if args.jsonl in (None, "-") else Path(args.jsonl)
    metrics_export.check_targets(args.tensorboard, jsonl)
    if not is_remote(args.root):  # no refusal records in an object store
        for note in refused.refused_notes("metrics", Path(args.root)):
            print(note, file=sys.stderr)
    steps = metrics_export.root_metrics(args.root)
    if args.tensorboard is None and args.jsonl is None:  # ROOT alone: a table to read
        sys.stdout.write(metrics_export.table_text(steps))
        return 0
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


def run_report(args: argparse.Namespace) -> int:
    if is_remote(args.root):
        raise UsageError(
            f"report: {args.root} is an object store: its step pages are objects of their "
            "own; serve them with the store's https or website endpoint and set "
            "ROLLOUT_SHARDS_REPORT_URL to it (docs/report.md)"
        )
    if args.serve:
        from pipeline.report.serve import serve

        serve(args.root, args.host, args.port)
        return 0
    from pipeline.report.index import write_index

    print(f"{PROG}: report: {write_index(args.root, args.out)}")
    return 0
