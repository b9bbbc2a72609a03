"""The rules across rows slime holds a step's rows to: the common `ROWS` less miles' own
rules on rollout ids, plus slime's `validate_rollout_id_annotated`."""

from __future__ import annotations

import polars as pl

from pipeline import columns as c
from pipeline.schemas.rules import ROWS, Model, Rule

# slime's `validate_rollout_id_annotated` asks only that the samples of one compact rollout
# (the leaves of a multi-leaf trajectory) carry one rollout_id; it neither requires null
# ids elsewhere, nor a session version on multi-leaf rows, nor one trajectory per id (two
# trajectories sharing an id are one rollout to it).
MILES_ONLY_RULES = (
    "multi_leaf_only_in_v2",
    "rollout_id_only_on_v2_multi_leaf",
    "rollout_key_unique_per_trajectory",
)
ROW_RULES = Model(
    "SlimeSampleRules",
    rules=(
        *(rule for rule in ROWS.rules if rule.name not in MILES_ONLY_RULES),
        Rule(
            "rollout_id_on_multi_leaf",
            "every leaf of a multi-leaf trajectory must carry the trajectory's rollout_id "
            "(slime's validate_rollout_id_annotated)",
            (pl.col(c.TRAJECTORY_SIZE) == 1) | pl.col(c.ROLLOUT_ID).is_not_null(),
        ),
    ),
)
