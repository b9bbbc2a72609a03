"""rollout-shards-loader: a trainer reads its rank's rollout data from a step folder.

`read_rank(step_folder, rank)` gives the dict miles' trainer holds after
`process_rollout_data` for that rank (`rollout_shards_loader.miles`, one module per
trainer); `read_manifest(step_folder)` the step's manifest.
"""

from rollout_shards_loader._convert import Ragged
from rollout_shards_loader._folder import ShardVerificationError
from rollout_shards_loader._manifest import read_manifest
from rollout_shards_loader._step import StepNotBuiltError, StepRefusedError, wait_for_step
from rollout_shards_loader.miles import read_rank

__all__ = [
    "Ragged",
    "ShardVerificationError",
    "StepNotBuiltError",
    "StepRefusedError",
    "read_manifest",
    "read_rank",
    "wait_for_step",
]
__version__ = "0.1.0"
