"""miles (radixark/miles): rewards normalized per prompt group in float32, trailing rows
trimmed to whole global batches, the strided, balanced or rollout-side DP split, and the
weight-staleness budget. Reached through `pipeline.trainers.profile("miles")`."""
