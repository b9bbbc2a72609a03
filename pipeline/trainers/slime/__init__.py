"""slime (THUDM/slime): rewards normalized by position, the rollout-side DP and
micro-batch schedule always, rank files with `source_names`. Reached through
`pipeline.trainers.profile("slime")`."""
