"""Legacy rollout-id repair (`rollout_id_policy: repair`, CONTRACT section 3).

Two windows of miles history wrote ids the rule now refuses (SEMANTICS section 2):
before PR #2536 every v2 reply was stamped, singletons included, and v1 rows could carry
their input's id; before PR #2368 v2 multi-leaf leaves carried no id at all. Repair
undoes exactly those two patterns and counts each repaired row per pattern. A single-row
trajectory's id is cleared whatever its session version: v1 and v2 singletons alike lose
it, so a table that does not say which one it is (miles' samples store no session
version) needs no answer. Anything else (several rows sharing an index without v2,
siblings with two different ids) is left for validation to refuse.
"""

from __future__ import annotations

import polars as pl

from pipeline import columns as c

CLEARED = "cleared_on_v1_or_singleton"
STAMPED = "stamped_on_v2_multi_leaf"


def clears(session: pl.Expr, multi_leaf: pl.Expr) -> pl.Expr:
    """Rows whose id repair clears (where they carry one): v1 rows, and every single-row
    trajectory whatever its session version."""
    return (session == "v1").fill_null(False) | ~multi_leaf


def stamps(session: pl.Expr, multi_leaf: pl.Expr) -> pl.Expr:
    """Rows repair gives an id (where they lack one): the leaves of v2 multi-leaf
    trajectories."""
    return (session == "v2").fill_null(False) & multi_leaf


def repairable(session: pl.Expr, multi_leaf: pl.Expr, rollout_id: pl.Expr) -> pl.Expr:
    """Rows that break the rollout-id rule only as a legacy window wrote them: repair
    makes them keep it."""
    return (rollout_id.is_not_null() & clears(session, multi_leaf)) | (
        rollout_id.is_null() & stamps(session, multi_leaf)
    )


def repair_rollout_ids(frame: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """Clear ids on v1 rows and single-row trajectories (before miles PR #2536) and stamp
    missing ids on v2 multi-leaf leaves with a sibling's id, else their index (before PR
    #2368), as miles stamps every leaf with the input's id, else its index."""
    if c.ROLLOUT_ID not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Int64).alias(c.ROLLOUT_ID))
    session = (
        pl.col(c.SESSION_VERSION) if c.SESSION_VERSION in frame.columns else pl.lit(None, pl.String)
    )
    multi_leaf = pl.len().over(c.TRAJECTORY) > 1
    rollout_id = pl.col(c.ROLLOUT_ID)
    sibling_id = rollout_id.drop_nulls().first().over(c.TRAJECTORY)
    flagged = frame.with_columns(
        (clears(session, multi_leaf) & rollout_id.is_not_null()).alias(CLEARED),
        (stamps(session, multi_leaf) & rollout_id.is_null()).alias(STAMPED),
        pl.coalesce(sibling_id, pl.col(c.INDEX)).alias("_stamp"),
    )
    counts = {
        CLEARED: int(flagged.get_column(CLEARED).sum()),
        STAMPED: int(flagged.get_column(STAMPED).sum()),
    }
    repaired = flagged.with_columns(
        pl.when(pl.col(CLEARED))
        .then(pl.lit(None, dtype=pl.Int64))
        .when(pl.col(STAMPED))
        .then(pl.col("_stamp"))
        .otherwise(rollout_id)
        .alias(c.ROLLOUT_ID)
    ).drop(CLEARED, STAMPED, "_stamp")
    return repaired, counts


def filled_rollout_ids(ids: pl.Series) -> pl.Series:
    """slime's fill: each missing id, in batch order, becomes the smallest integer not
    used yet (by a given id or an earlier fill): the first m integers >= 0 outside the
    given ids, in order."""
    missing = int(ids.null_count())
    if not missing:
        return ids
    used = ids.drop_nulls().unique()
    candidates = pl.int_range(0, missing + len(used), dtype=pl.Int64, eager=True)
    free = candidates.filter(~candidates.is_in(used.implode())).head(missing)
    slots = ids.is_null().cum_sum().cast(pl.Int64) - 1
    return (
        pl.select(pl.when(ids.is_null()).then(free.gather(slots.clip(0))).otherwise(ids))
        .to_series()
        .alias(ids.name)
    )
