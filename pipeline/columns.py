"""Every column of the contract (CONTRACT.md sections 1 and 2), declared once in `COLUMNS`.

One row per column: its name, its type in a rollout sample table (`input`), its type in a
rank file (`shard`), whether it is optional, what it holds, and the key the trainer gets it
under. The input schema, the rules' column model, the shard schema, the dataset card and the
Dagster column schema are derived from the rows; a test ties the loader's keys
(`loader/rollout_shards_loader`, which imports nothing of this package) to them.

A column is **optional** when a step's input may lack it (absent, or null on its rows). An
optional column with a shard type is written as is: every rank file of every step carries
it, null where the step lacks it, and a step's manifest lists it in `present_columns` when
the step has it. Adding one takes its row here, its key in the loader (when the trainer gets
it) and its rows in docs/contract.md; tests/core/test_columns.py names whichever is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

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
WEIGHT_VERSION_SPANS = "weight_version_spans"
SAMPLING_MASK_IDS = "rollout_sampling_mask_ids"
SAMPLING_MASK_OFFSETS = "rollout_sampling_mask_offsets"
RAW_REWARD = "raw_reward"
ROUND_NUMBER = "round_number"
TRAIN_METADATA = "train_metadata"
PROMPT = "prompt"
METADATA = "metadata"

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

STATUSES = ("pending", "completed", "truncated", "aborted", "failed")
SESSION_VERSIONS = ("v1", "v2")
# miles' `WeightVersionSpan` (miles PR #1891): the tokens [abs_start, abs_end) of the
# sample that weight version `version` generated; a sample holds one list of them per
# generation call (`WeightVersionsPerCall`), in call order.
SPAN_VERSION, SPAN_START, SPAN_END = "version", "abs_start", "abs_end"
WEIGHT_VERSION_SPAN = pl.Struct(
    {SPAN_VERSION: pl.String(), SPAN_START: pl.Int64(), SPAN_END: pl.Int64()}
)


@dataclass(frozen=True)
class Column:
    """One column of the contract.

    `input` is its type in a rollout sample table (None: not read from the input); `shard`
    its type in a rank file (None: not written), under `shard_name` when that differs from
    `name`. An input column that is not `optional` is in every file, unless it is `filled`
    (a step's loader fills it: the step from the path, leaves numbered, remove_sample
    false), and never null. `isin` and `ge` bound its values, `struct` lets it also be a
    struct of its type (read through `reward_key`). An optional column that is written
    must be set on every row of a step or on none, unless `all_or_none` is False.
    `trainer_key`: the key the loader hands the shard column to the trainer under (None:
    the trainer never gets it). `per_token`: an input list with a value per token, nearly
    all of a step's bytes, which the rank-bounded build holds for one part at a time.
    """

    name: str
    description: str
    input: pl.DataType | None = None
    shard: pl.DataType | None = None
    optional: bool = False
    trainer_key: str | None = None
    shard_name: str | None = None
    filled: bool = False
    all_or_none: bool = True
    struct: bool = False
    isin: tuple[str, ...] | None = None
    ge: int | None = None
    per_token: bool = False

    @property
    def written_as(self) -> str:
        """The column's name in a rank file."""
        return self.shard_name or self.name


# Table order is the input columns' order (the order the rules report in) and, among the
# written columns, the rank files' order: the required ones, then the optional ones, then
# the partition columns `step` and `rank` (PARTITION_COLUMNS) last. A name may have two
# rows, one read and one written (`raw_reward`), when the written column is not a copy.
COLUMNS: tuple[Column, ...] = (
    Column(
        BATCH_POSITION,
        "position in the step's trimmed, flattened batch (miles' partition entries)",
        shard=pl.Int64(),
    ),
    Column(
        TRAIN_STEP,
        "optimizer step within the rollout step that trains this row, 0-based; "
        "null when the trainer never trains it",
        shard=pl.Int32(),
    ),
    Column(
        MICRO_BATCH,
        "micro-batch within this rank and train step; null without a schedule",
        shard=pl.Int32(),
    ),
    Column(
        STEP,
        "rollout step (miles' rollout_id of RolloutManager)",
        input=pl.Int64(),
        shard=pl.Int64(),
        filled=True,
    ),
    Column(GROUP_INDEX, "prompt group (Sample.group_index)", input=pl.Int64(), optional=True),
    Column(INDEX, "Sample.index", input=pl.Int64()),
    Column(LEAF, "position among the generate call's leaves", input=pl.Int32(), filled=True, ge=0),
    Column(ROLLOUT_ID, "Sample.rollout_id", input=pl.Int64(), optional=True),
    Column(
        SESSION_VERSION,
        "session server version",
        input=pl.String(),
        optional=True,
        isin=SESSION_VERSIONS,
    ),
    Column(STATUS, "Sample.status", input=pl.String(), isin=STATUSES),
    Column(
        TOKENS,
        "prompt + response token ids",
        input=pl.List(pl.Int32()),
        shard=pl.List(pl.Int32()),
        trainer_key=TOKENS,
        per_token=True,
    ),
    Column(RESPONSE_LENGTH, "response tokens at the end of tokens", input=pl.Int32(), ge=0),
    Column(
        RESPONSE_LENGTHS,
        "response tokens at the end of tokens",
        shard=pl.Int32(),
        trainer_key=RESPONSE_LENGTHS,
    ),
    Column(TOTAL_LENGTHS, "len(tokens)", shard=pl.Int32(), trainer_key=TOTAL_LENGTHS),
    Column(
        LOSS_MASK,
        "loss mask of the response tokens",
        input=pl.List(pl.Int8()),
        optional=True,
        per_token=True,
    ),
    Column(
        LOSS_MASKS,
        "per response token: 1 trains it, 0 does not (remove_sample zeroes it)",
        shard=pl.List(pl.Int8()),
        trainer_key=LOSS_MASKS,
    ),
    Column(REWARD, "the reward", input=pl.Float64(), struct=True),
    Column(
        REWARDS,
        "normalized reward (GRPO-style, float32 arithmetic as miles) or the raw reward",
        shard=pl.Float64(),
        trainer_key=REWARDS,
    ),
    Column(
        RAW_REWARD,
        "the reward before normalization (the raw_reward input column when set)",
        shard=pl.Float64(),
        trainer_key=RAW_REWARD,
    ),
    Column(
        TRUNCATED,
        "1 when the sample's status is truncated",
        shard=pl.Int8(),
        trainer_key=TRUNCATED,
    ),
    Column(
        SAMPLE_INDICES,
        "Sample.index (shared by the leaves of one generate call)",
        shard=pl.Int64(),
        trainer_key=SAMPLE_INDICES,
    ),
    Column(
        ROLLOUT_IDS,
        "rollout_id, else index: the rollout the loss counts once",
        shard=pl.Int64(),
        trainer_key=ROLLOUT_IDS,
    ),
    Column(
        ROLLOUT_MASK_SUMS,
        "loss-mask total over every row of the batch with the same rollout_ids",
        shard=pl.Int64(),
        trainer_key=ROLLOUT_MASK_SUMS,
    ),
    Column(
        REMOVE_SAMPLE,
        "true zeroes the loss mask",
        input=pl.Boolean(),
        filled=True,
    ),
    Column(
        ROLLOUT_LOG_PROBS,
        "log probs of the response tokens at rollout; null when the step has none",
        input=pl.List(pl.Float32()),
        shard=pl.List(pl.Float32()),
        optional=True,
        trainer_key=ROLLOUT_LOG_PROBS,
        per_token=True,
    ),
    Column(
        TEACHER_LOG_PROBS,
        "teacher log probs of the response tokens; null when the step has none",
        input=pl.List(pl.Float32()),
        shard=pl.List(pl.Float32()),
        optional=True,
        trainer_key=TEACHER_LOG_PROBS,
        per_token=True,
    ),
    Column(
        SAMPLING_MASK_IDS,
        "the token ids of each response token's sampling support, flattened (miles' "
        "rollout_sampling_mask_ids, compressed sparse rows); null when the step has none",
        input=pl.List(pl.Int32()),
        shard=pl.List(pl.Int32()),
        optional=True,
        trainer_key=SAMPLING_MASK_IDS,
        per_token=True,
    ),
    Column(
        SAMPLING_MASK_OFFSETS,
        "where each response token's support starts in rollout_sampling_mask_ids, then its "
        "length: response_length + 1 offsets from 0, strictly increasing; null when the "
        "step has none",
        input=pl.List(pl.Int32()),
        shard=pl.List(pl.Int32()),
        optional=True,
        trainer_key=SAMPLING_MASK_OFFSETS,
        per_token=True,
        # set with the ids on each row (rollout_sampling_mask_shape): the ids' all-or-none
        # rule speaks for both, one line as miles' one ValueError
        all_or_none=False,
    ),
    Column(
        WEIGHT_VERSIONS,
        "policy weight versions that produced the response; null when the step has none",
        input=pl.List(pl.String()),
        shard=pl.List(pl.String()),
        optional=True,
        trainer_key=WEIGHT_VERSIONS,
        # miles gives a sample without weight versions an empty list
        all_or_none=False,
    ),
    Column(
        WEIGHT_VERSION_SPANS,
        "per generation call, the weight-version spans of the sample's tokens "
        "({version, abs_start, abs_end}, miles' weight_versions since PR #1891); "
        "null when the step has none",
        input=pl.List(pl.List(WEIGHT_VERSION_SPAN)),
        shard=pl.List(pl.List(WEIGHT_VERSION_SPAN)),
        optional=True,
        # the trainer's key for either form: a step holds one (weight_versions_one_form)
        trainer_key=WEIGHT_VERSIONS,
        all_or_none=False,
    ),
    Column(
        RAW_REWARD,
        "overrides the raw reward written to shards",
        input=pl.Float64(),
        optional=True,
    ),
    Column(
        ROUND_NUMBER,
        "rollout-buffer round; null when the step has none",
        input=pl.Int64(),
        shard=pl.Int64(),
        optional=True,
        trainer_key=ROUND_NUMBER,
    ),
    Column(
        TRAIN_METADATA,
        "train_metadata (a JSON object); null when the step has none",
        input=pl.String(),
        shard=pl.String(),
        optional=True,
        shard_name=METADATA,
    ),
    Column(PROMPT, "the prompt, kept in the quarantine table", input=pl.String(), optional=True),
    Column(
        METADATA,
        "sample metadata, kept in the quarantine table (slime: its source_name)",
        input=pl.String(),
        optional=True,
    ),
    Column(RANK, "data-parallel rank whose file holds the row", shard=pl.Int32()),
)

# The hive-style keys of a rank file's path (`step=<N>/rank=<R>.parquet`), its last columns.
PARTITION_COLUMNS = (STEP, RANK)

INPUT_COLUMNS = tuple(col for col in COLUMNS if col.input is not None)
_WRITTEN = tuple(col for col in COLUMNS if col.shard is not None)

# Each input column's contract type, but `reward`'s, which is typed on read from what the
# file holds (float64, or a struct of float64) by the readers' type conformance.
INPUT_SCHEMA: dict[str, pl.DataType] = {
    col.name: col.input for col in INPUT_COLUMNS if col.input is not None and not col.struct
}
# The columns every input file must have.
REQUIRED_COLUMNS = tuple(col.name for col in INPUT_COLUMNS if not (col.optional or col.filled))
# Optional input columns set on every row of a step or on none (SEMANTICS section 4).
ALL_OR_NONE = tuple(
    col.name for col in INPUT_COLUMNS if col.optional and col.all_or_none and col.shard is not None
)
# The input lists with a value per token (`Column.per_token`).
PER_TOKEN_COLUMNS = tuple(col.name for col in INPUT_COLUMNS if col.per_token)


def has_column(name: str) -> str:
    """The light column telling whether a row's optional `name` is set."""
    return f"_has_{name}"


# The shard columns every step has (the partition columns aside), in file order.
SHARD_COLUMNS = tuple(
    col.written_as
    for col in _WRITTEN
    if not col.optional and col.written_as not in PARTITION_COLUMNS
)
# Optional shard columns, each copied from its input column: in every rank file of every
# step, typed as the contract, null where the step lacks them.
OPTIONAL_SHARD_COLUMNS = tuple(col.written_as for col in _WRITTEN if col.optional)
# The input column each optional shard column is copied from.
OPTIONAL_SHARD_SOURCES = {col.written_as: col.name for col in _WRITTEN if col.optional}
# Every column of a rank file, in file order: the output root reads as one dataset.
DATASET_COLUMNS = (*SHARD_COLUMNS, *OPTIONAL_SHARD_COLUMNS, *PARTITION_COLUMNS)
_BY_SHARD_NAME = {col.written_as: col for col in _WRITTEN}
DATASET_SCHEMA: dict[str, pl.DataType] = {
    name: dtype for name in DATASET_COLUMNS if (dtype := _BY_SHARD_NAME[name].shard) is not None
}
# What each rank-file column holds: the `training_shards` column schema in the UI and the
# dataset card of the output root show these.
DATASET_DESCRIPTIONS = {name: _BY_SHARD_NAME[name].description for name in DATASET_COLUMNS}
# The rank-file columns the loader hands the trainer, and the key of each.
TRAINER_KEYS = {name: key for name in DATASET_COLUMNS if (key := _BY_SHARD_NAME[name].trainer_key)}

# A trajectory: the rows of one step sharing `index` (one generate call's leaves).
TRAJECTORY = (STEP, INDEX)

# Provenance added on ingest, never written to shards.
SOURCE_FILE = "_file"
# Inputs miles trains on that the contract does not carry: a step holding a value in one
# is refused (miles' `multimodal_train_inputs` takes the plain DP split, its `adapter` the
# multi-LoRA path; shards without them would train otherwise).
MULTIMODAL_TRAIN_INPUTS = "multimodal_train_inputs"
ADAPTER = "adapter"
NOT_CARRIED = (MULTIMODAL_TRAIN_INPUTS, ADAPTER)
SOURCE_ROW = "_row"

# Internal columns: computed while a step is processed, never written to shards.
# row bookkeeping of transforms/samples.py
POSITION = "_pos"
N_TOKENS = "_n_tokens"
MASK_LEN = "_mask_len"
MASK_BINARY = "_mask_binary"
MASK_SUM = "_mask_sum"
RLP_LEN = "_rlp_len"
TLP_LEN = "_tlp_len"
SMO_LEN = "_sampling_mask_offsets_len"
# offsets from 0 to len(ids), strictly increasing (null without the pair)
SM_SHAPE = "_sampling_mask_shape"
# weight-version spans as miles' Sample.validate asserts them (null without spans)
SPANS_VALID = "_weight_version_spans_valid"
# the row holds weight versions in the string form / in spans (a non-empty list)
HAS_VERSION_STRINGS = "_has_version_strings"
HAS_VERSION_SPANS = "_has_version_spans"
METADATA_OBJECT = "_metadata_object"
LOG_PROBS_FINITE = "_log_probs_finite"  # every rollout and teacher log prob finite
TRAJECTORY_SIZE = "_trajectory_size"
ROLLOUT_KEY = "_rollout_key"
SOURCE_NAME = "_source_name"  # metadata's "source_name" (slime's `get_source`)
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
# What a step's report (pipeline/report) reads beside the scalar shard columns, carried in
# the planned rows but never written to a rank file: each row's prompt group, and how many
# weight versions its oldest numeric one lags the step (null without one).
REPORT_GROUP = "_report_group"
REPORT_STALENESS = "_report_staleness"
REPORT_COLUMNS = (REPORT_GROUP, REPORT_STALENESS)
REPORT_SCALARS = (RANK, TRAIN_STEP, REWARDS, RAW_REWARD, RESPONSE_LENGTHS, TOTAL_LENGTHS, TRUNCATED)
