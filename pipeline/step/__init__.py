"""One rollout step without Dagster: readers, the one check, plan, write, freshness, staging.

The names of the three stages are the names of the Dagster assets that run them.
"""

ROLLOUT_SAMPLES = "rollout_samples"
TRAIN_BATCH = "train_batch"
TRAINING_SHARDS = "training_shards"
STAGES = (ROLLOUT_SAMPLES, TRAIN_BATCH, TRAINING_SHARDS)
