"""The `rollout_samples` asset: a step's rows, read, typed and validated."""

from pipeline.assets import step_asset
from pipeline.step import ROLLOUT_SAMPLES

rollout_samples = step_asset(
    ROLLOUT_SAMPLES,
    description=(
        "A rollout step's sample rows in batch order, typed to the contract and validated "
        "(row invariants and the rollout-id rule of session v2). An invalid step fails here, "
        "before anything is written, with the rows per rule and the first offending rows; "
        "with `on_invalid: quarantine` whole invalid trajectories are set aside instead. "
        "Handed to `train_batch` in memory when both run together; staged as Parquet under "
        "`<output root>/.staging/rollout_samples/` when `train_batch` runs on its own later."
    ),
    kinds={"polars", "parquet"},
)
