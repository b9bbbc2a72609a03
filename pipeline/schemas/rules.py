"""The rules of a rollout sample table (CONTRACT section 1, SEMANTICS sections 2-5), as
plain Polars expressions: the one declaration both validators read.

`pipeline.schemas.samples` builds the Pandera schemas from these models, and Pandera
reports what fails; `pipeline.schemas.validate.passes` evaluates the same expressions in
one Polars query, so that a step that breaks no rule never imports Pandera (its import,
with pandas, is most of a small step's fixed cost).

`TABLE` checks the types, nullability and bounds of the full table, as `pipeline.columns`
declares them. The rules that look across rows run on the light per-row frame of
`transforms.samples.light_columns`, so failure cases never carry token lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from pipeline import columns as c


@dataclass(frozen=True)
class ColumnRule:
    """A contract column: its type, whether it may be null or absent, its allowed values
    (`isin`) or lower bound (`ge`); a null passes `isin` and `ge`, as in Pandera."""

    dtype: pl.DataType
    nullable: bool
    isin: tuple[str, ...] | None = None
    ge: int | None = None

    @property
    def required(self) -> bool:
        """Optional columns (those that may be null) may also be absent."""
        return not self.nullable


@dataclass(frozen=True)
class Rule:
    """A rule over rows: `expr` is true on the rows that keep it. A null passes unless
    `null_passes` is False."""

    name: str
    message: str
    expr: pl.Expr
    null_passes: bool = True

    @property
    def error(self) -> str:
        return f"{self.name}: {self.message}"

    def ok(self) -> pl.Expr:
        return self.expr.fill_null(self.null_passes)


@dataclass(frozen=True)
class Model:
    name: str
    columns: dict[str, ColumnRule] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()


V2_MULTI_LEAF = (pl.col(c.SESSION_VERSION) == "v2").fill_null(False) & (
    pl.col(c.TRAJECTORY_SIZE) > 1
)

TABLE = Model(
    "RolloutSampleTable",
    columns={
        col.name: ColumnRule(col.input, nullable=col.optional, isin=col.isin, ge=col.ge)
        for col in c.INPUT_COLUMNS
        if col.input is not None and not col.struct  # `reward` is typed on read
    },
)

# TABLE's tests split: those of the per-token lists, which the rank-bounded build runs on
# each part of a file as it reads it, and those of the other columns, run on the step's
# rows without their lists.
TABLE_LISTS = Model(
    "RolloutSampleLists",
    columns={n: r for n, r in TABLE.columns.items() if n in c.PER_TOKEN_COLUMNS},
)
TABLE_ROWS = Model(
    "RolloutSampleRows",
    columns={n: r for n, r in TABLE.columns.items() if n not in c.PER_TOKEN_COLUMNS},
)


def _all_or_none(name: str) -> pl.Expr:
    """The rows on the minority side are the odd ones out: rows without the column,
    unless fewer than half the rows have it (then those few rows are flagged)."""
    has = pl.col(c.has_column(name))
    mostly_set = has.sum() * 2 >= pl.len()
    return pl.when(mostly_set).then(has).otherwise(~has)


def _all_or_none_rule(name: str, message: str | None = None) -> Rule:
    text = message or f"{name} is null on some rows and set on others"
    return Rule(f"{name}_all_or_none", text, _all_or_none(name))


_V2 = (pl.col(c.SESSION_VERSION) == "v2").fill_null(False)
_SESSIONS = pl.col(c.SESSION_VERSION).fill_null("").n_unique().over(c.TRAJECTORY)
_REPEATED_LEAF = pl.len().over(c.STEP, c.INDEX, c.LEAF) > 1
# Some leaf of the trajectory is repeated (as `_REPEATED_LEAF.any().over(TRAJECTORY)`,
# computed with one window instead of a window inside a window).
_HAS_REPEATED_LEAF = pl.col(c.LEAF).n_unique().over(c.TRAJECTORY) < pl.len().over(c.TRAJECTORY)

_STRINGS, _SPANS = pl.col(c.HAS_VERSION_STRINGS), pl.col(c.HAS_VERSION_SPANS)
_MIXED_FORMS = _STRINGS.any() & _SPANS.any()
# the rows of the rarer form are the odd ones out (the string form on a tie)
_ODD_FORM = pl.when(_SPANS.sum() >= _STRINGS.sum()).then(_STRINGS).otherwise(_SPANS)

ROWS = Model(
    "SampleRules",
    rules=(
        Rule(
            "step_matches_path",
            "step column disagrees with the step in the file path",
            pl.col(c.STEP) == pl.col("_path_step"),
        ),
        Rule(
            "response_within_tokens",
            "response_length must be within 0..len(tokens)",
            pl.col(c.RESPONSE_LENGTH) <= pl.col(c.N_TOKENS),
        ),
        Rule(
            "loss_mask_length",
            "loss_mask length must equal response_length",
            pl.col(c.MASK_LEN) == pl.col(c.RESPONSE_LENGTH),
        ),
        Rule("loss_mask_binary", "loss_mask values must be 0 or 1", pl.col(c.MASK_BINARY)),
        Rule(
            "rollout_log_probs_length",
            "rollout_log_probs length must equal response_length",
            pl.col(c.RLP_LEN) == pl.col(c.RESPONSE_LENGTH),
        ),
        Rule(
            "teacher_log_probs_length",
            "teacher_log_probs length must equal response_length",
            pl.col(c.TLP_LEN) == pl.col(c.RESPONSE_LENGTH),
        ),
        Rule(
            "rollout_sampling_mask_offsets_length",
            "rollout_sampling_mask_offsets must hold response_length + 1 offsets",
            pl.col(c.SMO_LEN) == pl.col(c.RESPONSE_LENGTH) + 1,
        ),
        Rule(
            "rollout_sampling_mask_shape",
            "rollout_sampling_mask_ids and _offsets must be set together, the offsets from 0 "
            "to the number of ids and strictly increasing (a non-empty support per token), "
            "as miles' Sample.validate asserts",
            pl.col(c.SM_SHAPE),
        ),
        Rule(
            "weight_version_spans_order",
            "weight_version_spans must name a version in each span and hold, over the calls "
            "in order, previous abs_end <= abs_start < abs_end <= len(tokens), as miles' "
            "Sample.validate asserts",
            pl.col(c.SPANS_VALID),
        ),
        Rule(
            "weight_versions_one_form",
            "the step holds weight versions both as strings (weight_versions) and as spans "
            "(weight_version_spans): write one form for every row of a step",
            ~(_MIXED_FORMS & _ODD_FORM),
        ),
        Rule(
            "train_metadata_json_object",
            "train_metadata must be a JSON object ({...})",
            pl.col(c.METADATA_OBJECT),
        ),
        # Rows repeating a (step, index, leaf) are unique_leaf's to report, and a
        # trajectory mixing session versions is one_session_version's.
        Rule(
            "multi_leaf_only_in_v2",
            "several rows share this index without session_version v2: only session v2 "
            "writes multi-leaf trajectories, so these are duplicated rows",
            (pl.col(c.TRAJECTORY_SIZE) == 1) | _V2 | (_SESSIONS > 1) | _HAS_REPEATED_LEAF,
        ),
        Rule("unique_leaf", "(step, index, leaf) must be unique", ~_REPEATED_LEAF),
        Rule(
            "one_session_version",
            "all leaves of a trajectory must have one session_version",
            _SESSIONS == 1,
        ),
        Rule(
            "rollout_id_only_on_v2_multi_leaf",
            "rollout_id must be set exactly on the leaves of v2 multi-leaf trajectories "
            "(one id shared by the leaves); v1 rows and v2 singletons keep it null",
            pl.col(c.ROLLOUT_ID).is_not_null() == V2_MULTI_LEAF,
        ),
        # A leaf without an id is rollout_id_only_on_v2_multi_leaf's to report.
        Rule(
            "rollout_id_shared_by_siblings",
            "all leaves of a v2 multi-leaf trajectory must share one rollout_id",
            pl.col(c.ROLLOUT_ID).drop_nulls().n_unique().over(c.TRAJECTORY) <= 1,
        ),
        Rule(
            "rollout_key_unique_per_trajectory",
            "a rollout key (rollout_id, else index) must belong to exactly one trajectory "
            "of the step; two trajectories share it",
            pl.col(c.INDEX).n_unique().over(c.STEP, c.ROLLOUT_KEY) == 1,
        ),
        Rule(
            "reward_finite",
            "reward must be a finite number on every row",
            pl.col(c.REWARD_VALUE).is_finite(),
            null_passes=False,
        ),
        Rule(
            "raw_reward_finite",
            "raw_reward must be a finite number or null on every row",
            pl.col(c.RAW_REWARD).is_finite(),
        ),
        Rule(
            "log_probs_finite",
            "rollout_log_probs and teacher_log_probs must hold finite numbers only "
            "(no NaN or infinity)",
            pl.col(c.LOG_PROBS_FINITE),
        ),
        *(_all_or_none_rule(name) for name in c.ALL_OR_NONE),
    ),
)


def _rollout_shares_reward() -> pl.Expr:
    reward = pl.col(c.REWARD_VALUE)
    # NaN never equals itself, so NaN siblings disagree; a lone row always agrees.
    same = (pl.len() == 1) | ((reward.max() == reward.min()) & ~reward.is_nan().any())
    # A key shared by two trajectories is rollout_key_unique_per_trajectory's to report.
    shared_key = pl.col(c.INDEX).n_unique() > 1
    return (same | shared_key).over(c.STEP, c.ROLLOUT_KEY)


# Rows of one rollout share one raw reward (SEMANTICS 5.3 step 3), when normalizing.
SIBLINGS = Model(
    "SiblingRewards",
    rules=(
        Rule(
            "rollout_shares_reward",
            "all samples of a rollout must share one reward",
            _rollout_shares_reward(),
        ),
    ),
)
