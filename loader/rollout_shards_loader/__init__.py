"""rollout-shards-loader: a trainer reads its rank's rollout data from a step folder.

`read_rank(step_folder, rank)` gives the dict miles' trainer holds after
`process_rollout_data` for that rank; `read_manifest(step_folder)` the step's manifest.
"""

from rollout_shards_loader._read import Ragged, ShardVerificationError, read_manifest, read_rank

__all__ = ["Ragged", "ShardVerificationError", "read_manifest", "read_rank"]
__version__ = "0.1.0"
