"""The `rollout_samples` asset: a step's rows, read, typed and validated."""

import dagster as dg

from pipeline.assets import AUTOMATION_CONDITION, CODE_VERSION, GROUP
from pipeline.orchestration.partitions import rollout_steps
from pipeline.step import ROLLOUT_SAMPLES

rollout_samples = dg.AssetSpec(
    ROLLOUT_SAMPLES,
    partitions_def=rollout_steps,
    group_name=GROUP,
    code_version=CODE_VERSION,
    automation_condition=AUTOMATION_CONDITION,
    kinds={"polars", "parquet"},
    description=(
        "A rollout step's sample rows in batch order, typed to the contract and validated "
        "(row invariants and the rollout-id rule of session v2). An invalid step fails here, "
        "before anything is written, with the rows per rule and the first offending rows; "
        "with `on_invalid: quarantine` whole invalid trajectories are set aside instead. "
        "Handed to `train_batch` in memory when both run together; staged as Parquet under "
        "`<output root>/.staging/rollout_samples/` when `train_batch` runs on its own later."
    ),
)
