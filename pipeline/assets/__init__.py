"""The three assets of a rollout step, one spec per file, built together by `rollout_step`."""

GROUP = "rollout_shards"
