"""Column names of the contract (CONTRACT.md sections 1 and 2), in one place."""

from __future__ import annotations

import polars as pl

# Input: rollout sample tables.
STEP = "step"
GROUP_INDEX = "group_index"
INDEX = "index"
LEAF = "leaf"
ROLLOUT_ID = "rollout_id"
SESSION_VERSION = "session_version"
STATUS = "status"
TOKENS = "tokens"
RESPONSE_LENGTH = "response_length"
LOSS_MASK = "loss_mask"
REWARD = "reward"
REMOVE_SAMPLE = "remove_sample"
ROLLOUT_LOG_PROBS = "rollout_log_probs"
TEACHER_LOG_PROBS = "teacher_log_probs"
WEIGHT_VERSIONS = "weight_versions"
RAW_REWARD = "raw_reward"
ROUND_NUMBER = "round_number"
TRAIN_METADATA = "train_metadata"
PROMPT = "prompt"
METADATA = "metadata"

# Provenance added on ingest, never written to shards.
SOURCE_FILE = "_file"
SOURCE_ROW = "_row"

INPUT_SCHEMA: dict[str, pl.DataType] = {
    STEP: pl.Int64(),
    GROUP_INDEX: pl.Int64(),
    INDEX: pl.Int64(),
    LEAF: pl.Int32(),
    ROLLOUT_ID: pl.Int64(),
    SESSION_VERSION: pl.String(),
    STATUS: pl.String(),
    TOKENS: pl.List(pl.Int32()),
    RESPONSE_LENGTH: pl.Int32(),
    LOSS_MASK: pl.List(pl.Int8()),
    REMOVE_SAMPLE: pl.Boolean(),
    ROLLOUT_LOG_PROBS: pl.List(pl.Float32()),
    TEACHER_LOG_PROBS: pl.List(pl.Float32()),
    WEIGHT_VERSIONS: pl.List(pl.String()),
    RAW_REWARD: pl.Float64(),
    ROUND_NUMBER: pl.Int64(),
    TRAIN_METADATA: pl.String(),
    PROMPT: pl.String(),
    METADATA: pl.String(),
}
# `reward` is float64 or a struct of float64; it is typed on read (see io.conform).
REQUIRED_COLUMNS = (INDEX, STATUS, TOKENS, RESPONSE_LENGTH, REWARD)
STATUSES = ("pending", "completed", "truncated", "aborted", "failed")
SESSION_VERSIONS = ("v1", "v2")

# Output: training shards.
BATCH_POSITION = "batch_position"
TRAIN_STEP = "train_step"
MICRO_BATCH = "micro_batch"
RESPONSE_LENGTHS = "response_lengths"
TOTAL_LENGTHS = "total_lengths"
LOSS_MASKS = "loss_masks"
REWARDS = "rewards"
TRUNCATED = "truncated"
SAMPLE_INDICES = "sample_indices"
ROLLOUT_IDS = "rollout_ids"
ROLLOUT_MASK_SUMS = "rollout_mask_sums"
RANK = "rank"

SHARD_COLUMNS = (
    BATCH_POSITION,
    TRAIN_STEP,
    MICRO_BATCH,
    TOKENS,
    RESPONSE_LENGTHS,
    TOTAL_LENGTHS,
    LOSS_MASKS,
    REWARDS,
    RAW_REWARD,
    TRUNCATED,
    SAMPLE_INDICES,
    ROLLOUT_IDS,
    ROLLOUT_MASK_SUMS,
)

# Optional shard columns: in every rank file of every step, typed as the contract, null
# where the step lacks them; the manifest's `present_columns` lists those a step really has.
OPTIONAL_SHARD_COLUMNS = (
    ROLLOUT_LOG_PROBS,
    TEACHER_LOG_PROBS,
    WEIGHT_VERSIONS,
    ROUND_NUMBER,
    METADATA,
)
# The input column each optional shard column is copied from.
OPTIONAL_SHARD_SOURCES = {
    ROLLOUT_LOG_PROBS: ROLLOUT_LOG_PROBS,
    TEACHER_LOG_PROBS: TEACHER_LOG_PROBS,
    WEIGHT_VERSIONS: WEIGHT_VERSIONS,
    ROUND_NUMBER: ROUND_NUMBER,
    METADATA: TRAIN_METADATA,
}
# Every column of a rank file, in file order: the output root reads as one dataset.
DATASET_COLUMNS = (*SHARD_COLUMNS, *OPTIONAL_SHARD_COLUMNS, STEP, RANK)
DATASET_SCHEMA: dict[str, pl.DataType] = {
    BATCH_POSITION: pl.Int64(),
    TRAIN_STEP: pl.Int32(),
    MICRO_BATCH: pl.Int32(),
    TOKENS: pl.List(pl.Int32()),
    RESPONSE_LENGTHS: pl.Int32(),
    TOTAL_LENGTHS: pl.Int32(),
    LOSS_MASKS: pl.List(pl.Int8()),
    REWARDS: pl.Float64(),
    RAW_REWARD: pl.Float64(),
    TRUNCATED: pl.Int8(),
    SAMPLE_INDICES: pl.Int64(),
    ROLLOUT_IDS: pl.Int64(),
    ROLLOUT_MASK_SUMS: pl.Int64(),
    ROLLOUT_LOG_PROBS: pl.List(pl.Float32()),
    TEACHER_LOG_PROBS: pl.List(pl.Float32()),
    WEIGHT_VERSIONS: pl.List(pl.String()),
    ROUND_NUMBER: pl.Int64(),
    METADATA: pl.String(),
    STEP: pl.Int64(),
    RANK: pl.Int32(),
}
# What each rank-file column holds: the `training_shards` column schema in the UI and the
# dataset card of the output root show these.
DATASET_DESCRIPTIONS: dict[str, str] = {
    BATCH_POSITION: "position in the step's trimmed, flattened batch (miles' partition entries)",
    TRAIN_STEP: "optimizer step within the rollout step that trains this row, 0-based; "
    "null when the trainer never trains it",
    MICRO_BATCH: "micro-batch within this rank and train step; null without a schedule",
    TOKENS: "prompt + response token ids",
    RESPONSE_LENGTHS: "response tokens at the end of tokens",
    TOTAL_LENGTHS: "len(tokens)",
    LOSS_MASKS: "per response token: 1 trains it, 0 does not (remove_sample zeroes it)",
    REWARDS: "normalized reward (GRPO-style, float32 arithmetic as miles) or the raw reward",
    RAW_REWARD: "the reward before normalization (the raw_reward input column when set)",
    TRUNCATED: "1 when the sample's status is truncated",
    SAMPLE_INDICES: "Sample.index (shared by the leaves of one generate call)",
    ROLLOUT_IDS: "rollout_id, else index: the rollout the loss counts once",
    ROLLOUT_MASK_SUMS: "loss-mask total over every row of the batch with the same rollout_ids",
    ROLLOUT_LOG_PROBS: "log probs of the response tokens at rollout; null when the step has none",
    TEACHER_LOG_PROBS: "teacher log probs of the response tokens; null when the step has none",
    WEIGHT_VERSIONS: "policy weight versions that produced the response; null when the step "
    "has none",
    ROUND_NUMBER: "rollout-buffer round; null when the step has none",
    METADATA: "train_metadata (a JSON object); null when the step has none",
    STEP: "rollout step (miles' rollout_id of RolloutManager)",
    RANK: "data-parallel rank whose file holds the row",
}

# A trajectory: the rows of one step sharing `index` (one generate call's leaves).
TRAJECTORY = (STEP, INDEX)

# Internal columns: computed while a step is processed, never written to shards.
# row bookkeeping of transforms/samples.py
POSITION = "_pos"
N_TOKENS = "_n_tokens"
MASK_LEN = "_mask_len"
MASK_BINARY = "_mask_binary"
MASK_SUM = "_mask_sum"
RLP_LEN = "_rlp_len"
TLP_LEN = "_tlp_len"
METADATA_OBJECT = "_metadata_object"
LOG_PROBS_FINITE = "_log_probs_finite"  # every rollout and teacher log prob finite
TRAJECTORY_SIZE = "_trajectory_size"
ROLLOUT_KEY = "_rollout_key"
REWARD_VALUE = "_reward"
GROUP = "_group"
ROLLOUT_REWARD = "_r"
ROW_ID = "_row_id"  # a row's position in the step as loaded; stable while rows are removed
REASON = "reason"
PATH_STEP = "_path_step"
# Per-row text of every contract type a row's values do not fit (null when they all fit).
TYPE_ERROR = "_type_error"
# Per JSON Lines column, the rule a line's value broke while parsing (a boolean or a
# string where a number belongs, a key given twice), and that value's JSON text.
JSON_RULE = "_json_rule:"
JSON_VALUE = "_json_value:"
# Fields of the layout that no column holds: where a row sits in what the trainer reads.
RANK_POSITION = "rank_position"
INPUT_POSITION = "input_position"
# The k-th row sharing a key pairs with the other side's k-th, so duplicate keys (invalid
# input) are compared in order instead of multiplying in the join.
OCCURRENCE = "_occurrence"
IN_LEFT = "_in_left"
IN_RIGHT = "_in_right"
