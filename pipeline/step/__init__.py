"""One rollout step without Dagster: ingest, plan, write, freshness and staging.

The names of the three stages are the names of the Dagster assets that run them.
"""

ROLLOUT_SAMPLES = "rollout_samples"
TRAIN_BATCH = "train_batch"
TRAINING_SHARDS = "training_shards"
STAGES = (ROLLOUT_SAMPLES, TRAIN_BATCH, TRAINING_SHARDS)
