"""`compute: in_process`: the stages run in the Dagster step's own process."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg

from pipeline.orchestration.reporting import dagster_metadata
from pipeline.orchestration.stage_reports import stage_report
from pipeline.settings import Settings
from pipeline.step.ray_route import ray_route
from pipeline.step.roots import StepRoots
from pipeline.step.stages import run_stages


def in_process_session(
    context: dg.AssetExecutionContext,
    stages: list[str],
    roots: StepRoots,
    step: int,
    settings: Settings | None,
) -> Iterator[dg.MaterializeResult]:
    """Each stage's materialization as it finishes; a stage's StepError or UsageError is
    raised after the assets done before it. A run config naming `ray_address` builds the
    steps above `ray_above` with tasks on that cluster."""
    with ray_route(settings) as route:
        for stage, done in run_stages(stages, roots, step, settings, route):
            report = stage_report(done)
            context.log.info(report.log)
            yield dg.MaterializeResult(asset_key=stage, metadata=dagster_metadata(report.metadata))
