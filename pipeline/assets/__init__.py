"""The three assets of a rollout step, one file each, all in one asset group."""

GROUP = "rollout_shards"
