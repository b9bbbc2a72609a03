"""A naive, per-sample reference of SEMANTICS sections 3, 3.1, 4, 5 and 6.

Written the way miles' own conversion is written: one dict per sample, plain loops,
no dataframe. It imports nothing from `pipeline`, so the vectorised pipeline can be
checked against it (differential tests) and benchmarked against it (bench/miles_path.py).

Scope: compact detection, trimming, the dynamic global batch size, every shard column,
reward normalization with torch's float32 arithmetic, and the strided data-parallel
split; per sample also a row's forward FLOPs (`balance_by_flops`, SEMANTICS 7.7) and the
prompt groups the weight-staleness budget sets aside (3.2). Not here: `balance_data`, the
rollout-side schedule (SEMANTICS 7), the rollout-id schema rule, quarantine.

The last section is slime's conversion (docs/slime.md), whole: positional rewards,
the rollout-id fill, slime's schedule with its FLOPs estimate, and each rank's dict
(`slime_rank_dicts`), which tests/trainers/slime/test_slime_reference.py compares with slime's own
code.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

Row = dict[str, Any]

DEFAULT_SETTINGS: dict[str, Any] = {
    "global_batch_size": None,
    "dp_size": 1,
    "use_dynamic_global_batch_size": False,
    "disable_rollout_trim_samples": False,
    "advantage_estimator": "grpo",
    "rewards_normalization": True,
    "grpo_std_normalization": True,
    "reward_key": None,
    "n_samples_per_prompt": None,
    "rollout_batch_size": None,
}

NORMALIZED_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline")
STD_ESTIMATORS = ("grpo", "gspo")

# input column -> shard column, copied when the input has them (all rows or none)
ALL_OR_NONE_COLUMNS = {
    "rollout_log_probs": "rollout_log_probs",
    "teacher_log_probs": "teacher_log_probs",
    "round_number": "round_number",
    "train_metadata": "metadata",
}

# optional input columns that must be set on every row or on none (SEMANTICS 4, Ours)
ALL_OR_NONE_CHECKED = (*ALL_OR_NONE_COLUMNS, "raw_reward")

TORCH_VECTOR_WIDTH = 8
TORCH_GRAIN_SIZE = 32768


# --- torch's CPU float32 arithmetic -------------------------------------------------


def _ceil_log2(x: int) -> int:
    if x <= 2:
        return 1
    return (x - 1).bit_length()


def _multi_row_sum(rows: Sequence[Sequence[Any]], zero: Any) -> list[Any]:
    """aten's multi_row_sum with 4 columns: a 4-level cascade of 4 accumulators."""
    num_levels = 4
    size = len(rows)
    level_power = max(4, _ceil_log2(size) // num_levels)
    level_step = 1 << level_power
    level_mask = level_step - 1
    acc = [[zero] * 4 for _ in range(num_levels)]
    i = 0
    while i + level_step <= size:
        for _ in range(level_step):
            for k in range(4):
                acc[0][k] = acc[0][k] + rows[i][k]
            i += 1
        for j in range(1, num_levels):
            for k in range(4):
                acc[j][k] = acc[j][k] + acc[j - 1][k]
                acc[j - 1][k] = zero
            if i & (level_mask << (j * level_power)):
                break
    while i < size:
        for k in range(4):
            acc[0][k] = acc[0][k] + rows[i][k]
        i += 1
    for j in range(1, num_levels):
        for k in range(4):
            acc[0][k] = acc[0][k] + acc[j][k]
    return acc[0]


def _row_sum(items: Sequence[Any], zero: Any) -> Any:
    """aten's row_sum: rows of 4 into multi_row_sum, leftovers into the first sum."""
    size_ilp = len(items) // 4
    rows = [items[4 * i : 4 * i + 4] for i in range(size_ilp)]
    partial = _multi_row_sum(rows, zero)
    for i in range(size_ilp * 4, len(items)):
        partial[0] = partial[0] + items[i]
    for k in range(1, 4):
        partial[0] = partial[0] + partial[k]
    return partial[0]


def torch_f32_sum(values: Iterable[float], width: int = TORCH_VECTOR_WIDTH) -> np.float32:
    """`torch.tensor(values, dtype=torch.float).sum()` on the CPU, bit for bit.

    Follows aten/src/ATen/native/cpu/SumKernel.cpp (cascade_sum): below `width` values,
    row_sum over scalars (four partial sums, leftovers to the first); from `width` values
    on, vectorized_inner_sum: row_sum over `width`-lane vectors, then a scalar sum of the
    tail, then the lanes in order. The sum kernel is registered without an AVX512
    variant, so it runs 8-wide even on AVX512 machines. Checked bitwise against torch
    2.13 (CPU, AVX512 and default dispatch, one thread) for every size up to 300 and
    sizes up to 300,000; golden values in tests/test_reference.py. Not modelled: with
    several threads torch splits a sum of TORCH_GRAIN_SIZE values or more across them
    (seen to differ at 100,000 values on 2 threads), so that result depends on the
    trainer's thread count.
    """
    x = np.array(list(values), dtype=np.float32)
    zero = np.float32(0.0)
    n = len(x)
    if n < width:
        total = _row_sum(list(x), zero)
    else:
        n_vectors = n // width
        vectors = [x[i * width : (i + 1) * width] for i in range(n_vectors)]
        lanes = _row_sum(vectors, np.zeros(width, dtype=np.float32))
        total = zero
        for value in x[n_vectors * width :]:
            total = total + value
        for lane in lanes:
            total = total + lane
    # the output is zero-filled and the sum accumulated onto it
    return np.float32(zero + total)


def torch_f32_mean(values: Sequence[float]) -> np.float32:
    """`tensor.mean()` for float32 on the CPU: the float32 sum divided by n in float32."""
    return np.float32(torch_f32_sum(values) / np.float32(len(values)))


def torch_f32_std(values: Sequence[float]) -> np.float32:
    """`tensor.std()` for float32 on the CPU (std_var_all_cpu, Bessel's correction).

    Squared deviations from the float32 mean, accumulated in float64 in order; the
    square root in float64, rounded to float32.
    """
    mean = float(torch_f32_mean(values))
    total = 0.0
    for value in values:
        dx = float(np.float32(value)) - mean
        total += dx * dx
    return np.float32(math.sqrt(total / max(0, len(values) - 1)))


# --- settings and batch shape -------------------------------------------------------


def effective_settings(settings: dict[str, Any]) -> dict[str, Any]:
    merged = {**DEFAULT_SETTINGS, **{k: v for k, v in settings.items() if v is not None}}
    if merged["global_batch_size"] is None and not merged["use_dynamic_global_batch_size"]:
        raise ValueError("global_batch_size is required")
    if merged.get("balance_data") or merged.get("cp_size") is not None:
        raise NotImplementedError("the reference covers the strided split only (SEMANTICS 6)")
    # miles turns std normalization off itself when there is one sample per prompt
    if merged["n_samples_per_prompt"] == 1:
        merged["grpo_std_normalization"] = False
    return merged


def is_compact_batch(rows: list[Row]) -> bool:
    return any(row.get("rollout_id") is not None for row in rows)


def rollout_key(row: Row) -> int:
    rollout_id = row.get("rollout_id")
    return rollout_id if rollout_id is not None else row["index"]


def dynamic_global_batch_size(num_samples: int, dp_size: int) -> int:
    return (num_samples // dp_size) * dp_size or dp_size


def trim_samples(rows: list[Row], global_batch_size: int) -> list[Row]:
    num_samples = len(rows)
    if num_samples % global_batch_size == 0:
        return rows
    keep = (num_samples // global_batch_size) * global_batch_size
    if keep == 0:
        raise ValueError(
            f"not enough samples {num_samples} for global_batch_size {global_batch_size}"
        )
    return rows[:keep]


# --- per-row values -----------------------------------------------------------------


def get_reward_value(row: Row, position: int, reward_key: str | None) -> float:
    reward = row.get("reward")
    if isinstance(reward, dict):
        if reward_key is None:
            raise ValueError(f"row {position}: reward is a struct; set reward_key")
        if reward.get(reward_key) is None:
            raise ValueError(f"row {position}: reward has no field {reward_key!r} (reward_key)")
        reward = reward[reward_key]
    if reward is None:
        raise ValueError(f"row {position}: reward is null")
    return float(reward)


def check_loss_mask(row: Row, position: int) -> None:
    mask = row.get("loss_mask")
    if mask is None:
        return
    if len(mask) != row["response_length"]:
        raise ValueError(
            f"row {position}: loss mask length {len(mask)} != response length "
            f"{row['response_length']}"
        )
    for value in mask:
        if value not in (0, 1):
            raise ValueError(f"row {position}: loss mask value {value} is not 0 or 1")


def loss_mask_of(row: Row) -> list[int]:
    response_length = row["response_length"]
    if row.get("remove_sample"):
        return [0] * response_length
    mask = row.get("loss_mask")
    return [1] * response_length if mask is None else mask


def check_rows(rows: list[Row], reward_key: str | None) -> None:
    """Row invariants of SEMANTICS 4 and 5.1, over every input row (before trimming)."""
    for position, row in enumerate(rows):
        check_loss_mask(row, position)
        get_reward_value(row, position, reward_key)
    for column in ALL_OR_NONE_CHECKED:
        set_rows = [i for i, row in enumerate(rows) if row.get(column) is not None]
        if set_rows and len(set_rows) != len(rows):
            null_rows = [i for i, row in enumerate(rows) if row.get(column) is None]
            raise ValueError(
                f"column {column} is set on some rows and null on others: null on rows "
                f"{null_rows[:5]}"
            )


# --- rewards (SEMANTICS 5) ----------------------------------------------------------


def prompt_groups(
    rows: list[Row], settings: dict[str, Any], ingested: int | None = None
) -> list[list[int]]:
    """Row positions of each prompt group, groups in order of first appearance. `ingested`:
    the rows of the step as given when `rows` are what is left of them after whole groups
    went aside (SEMANTICS 5.4): the fixed fan-out is judged on that count."""
    if rows and all(row.get("group_index") is not None for row in rows):
        groups: dict[int, list[int]] = {}
        for position, row in enumerate(rows):
            groups.setdefault(row["group_index"], []).append(position)
        return list(groups.values())
    n = settings["n_samples_per_prompt"]
    batch = settings["rollout_batch_size"]
    count = len(rows) if ingested is None else ingested
    if n is not None and batch is not None and count == n * batch:
        return [list(range(start, start + n)) for start in range(0, len(rows), n)]
    return [list(range(len(rows)))]


def check_trim_keeps_groups(rows: list[Row], kept: int, settings: dict[str, Any]) -> None:
    """SEMANTICS 5.4: a trim may not cut a reward group as the step was given (some rows
    kept, some trimmed); a whole-batch group is cut by any trim."""
    normalize = (
        settings["advantage_estimator"] in NORMALIZED_ESTIMATORS
        and settings["rewards_normalization"]
    )
    if not normalize or kept == len(rows):
        return
    for group in prompt_groups(rows, settings):
        inside = [position < kept for position in group]
        if any(inside) and not all(inside):
            raise ValueError(f"trim_cuts_reward_group: trimming to {kept} rows cuts {group}")


def normalize_rollout_rewards(
    values: list[float], settings: dict[str, Any]
) -> tuple[list[float], bool]:
    """Normalized value of each rollout of one group, and whether all were equal."""
    r = [np.float32(v) for v in values]
    if len(r) == 1:
        return [0.0], True
    if all(v == r[0] for v in r):
        # Ours: exact zeros instead of torch's rounding noise
        return [0.0] * len(r), True
    mean = torch_f32_mean(r)
    out = [np.float32(v - mean) for v in r]
    if settings["advantage_estimator"] in STD_ESTIMATORS and settings["grpo_std_normalization"]:
        std = torch_f32_std(r)
        if std > 0:
            denominator = np.float32(std + np.float32(1e-6))
            out = [np.float32(v / denominator) for v in out]
    return [float(v) for v in out], False


def post_process_rewards(
    rows: list[Row], raw_rewards: list[float], settings: dict[str, Any], ingested: int | None = None
) -> tuple[list[float], int]:
    """The `rewards` column and the number of equal-reward groups."""
    normalize = (
        settings["advantage_estimator"] in NORMALIZED_ESTIMATORS
        and settings["rewards_normalization"]
    )
    if not normalize:
        return list(raw_rewards), 0

    rewards = [0.0] * len(rows)
    equal_reward_groups = 0
    for group in prompt_groups(rows, settings, ingested):
        rollouts: dict[int, list[int]] = {}
        for position in group:
            rollouts.setdefault(rollout_key(rows[position]), []).append(position)
        values = []
        for key, positions in rollouts.items():
            first = raw_rewards[positions[0]]
            if any(not raw_rewards[p] == first for p in positions[1:]):
                shown = [raw_rewards[p] for p in positions]
                raise ValueError(
                    f"all samples in rollout {key} must share one reward; "
                    f"rows {positions} have rewards {shown}"
                )
            values.append(first)
        normalized, all_equal = normalize_rollout_rewards(values, settings)
        equal_reward_groups += all_equal
        for value, positions in zip(normalized, rollouts.values(), strict=True):
            for position in positions:
                rewards[position] = value
    return rewards, equal_reward_groups


# --- the whole step -----------------------------------------------------------------


def convert_samples_to_shard_rows(
    rows: list[Row],
    settings: dict[str, Any],
    global_batch_size: int,
    is_compact: bool,
    ingested: int | None = None,
) -> tuple[list[Row], int]:
    raw_rewards = [get_reward_value(row, i, settings["reward_key"]) for i, row in enumerate(rows)]
    rewards, equal_reward_groups = post_process_rewards(rows, raw_rewards, settings, ingested)
    loss_masks = [loss_mask_of(row) for row in rows]

    mask_sums: dict[int, int] = {}
    for row, mask in zip(rows, loss_masks, strict=True):
        key = rollout_key(row)
        mask_sums[key] = mask_sums.get(key, 0) + sum(mask)

    present = {
        column: any(row.get(column) is not None for row in rows) for column in ALL_OR_NONE_COLUMNS
    }
    has_weight_versions = any(row.get("weight_versions") for row in rows)
    has_spans = any(row.get("weight_version_spans") for row in rows)

    shard_rows = []
    for position, row in enumerate(rows):
        key = rollout_key(row)
        raw_override = row.get("raw_reward")
        shard_row = {
            "batch_position": position,
            "train_step": None,  # set per rank by step_through_ranks
            "micro_batch": None,
            "tokens": row["tokens"],
            "response_lengths": row["response_length"],
            "total_lengths": len(row["tokens"]),
            "loss_masks": loss_masks[position],
            "rewards": rewards[position],
            "raw_reward": raw_override if raw_override is not None else raw_rewards[position],
            "truncated": 1 if row["status"] == "truncated" else 0,
            "sample_indices": row["index"],
            "rollout_ids": key,
            "rollout_mask_sums": mask_sums[key],
        }
        for column, shard_column in ALL_OR_NONE_COLUMNS.items():
            if present[column]:
                shard_row[shard_column] = row[column]
        if has_weight_versions:
            shard_row["weight_versions"] = row.get("weight_versions")
        if has_spans:
            shard_row["weight_version_spans"] = row.get("weight_version_spans")
        shard_rows.append(shard_row)
    return shard_rows, equal_reward_groups


def split_by_dp(shard_rows: list[Row], dp_size: int) -> list[list[Row]]:
    return [shard_rows[rank::dp_size] for rank in range(dp_size)]


def step_through_ranks(ranks: list[list[Row]], global_batch_size: int, dp_size: int) -> int:
    """miles' get_data_iterator without the schedule: each rank takes its rows
    global_batch_size // dp_size at a time, one optimizer step per whole chunk; a row in
    no whole chunk keeps train_step None. Ranks must agree on the step count, and run at
    least one step (a trainer that trains nothing on a step is refused). Returns the
    number of untrained rows."""
    per_step = global_batch_size // dp_size
    if any(not rows for rows in ranks):
        raise ValueError(f"a rank gets no rows: rank sizes {[len(rows) for rows in ranks]}")
    step_counts = []
    untrained = 0
    for rows in ranks:
        steps = len(rows) // per_step
        step_counts.append(steps)
        for local, row in enumerate(rows):
            chunk = local // per_step
            if chunk < steps:
                row["train_step"] = chunk
            else:
                untrained += 1
    if len(set(step_counts)) > 1:
        raise ValueError(f"ranks would run different numbers of steps: {step_counts}")
    if step_counts[0] == 0:
        raise ValueError("the trainer would run no optimizer step")
    return untrained


def reference_build(
    rows: list[Row], settings: dict[str, Any], step_ranks: bool = True
) -> dict[str, Any]:
    """One step's sample rows (batch order) -> what each data-parallel rank trains on.
    Without `step_ranks` the train steps stay None and ranks are not checked (for callers
    that take only the per-sample values)."""
    settings = effective_settings(settings)
    dp_size = settings["dp_size"]
    is_compact = is_compact_batch(rows)
    check_rows(rows, settings["reward_key"])

    dynamic = None
    if settings["use_dynamic_global_batch_size"]:
        if is_compact:
            raise ValueError(
                "use_dynamic_global_batch_size needs a batch trimmed by row count, but this "
                "batch is compact (rows carry rollout_id); turn the setting off"
            )
        if settings["disable_rollout_trim_samples"]:
            raise ValueError(
                "use_dynamic_global_batch_size needs trimming, but "
                "disable_rollout_trim_samples is on; turn one of them off"
            )
        dynamic = dynamic_global_batch_size(len(rows), dp_size)
        global_batch_size = dynamic
    else:
        global_batch_size = settings["global_batch_size"]

    kept = rows
    if not settings["disable_rollout_trim_samples"] and not is_compact:
        kept = trim_samples(rows, global_batch_size)
        check_trim_keeps_groups(rows, len(kept), settings)

    # the groups as given: a fixed fan-out judged on the step's rows before the trim
    shard_rows, equal_reward_groups = convert_samples_to_shard_rows(
        kept, settings, global_batch_size, is_compact, ingested=len(rows)
    )
    if global_batch_size % dp_size:
        raise ValueError(f"global_batch_size {global_batch_size} not divisible by dp {dp_size}")
    ranks = split_by_dp(shard_rows, dp_size)
    untrained = step_through_ranks(ranks, global_batch_size, dp_size) if step_ranks else 0
    return {
        "ranks": ranks,
        "untrained": untrained,
        "is_compact": is_compact,
        "global_batch_size": global_batch_size,
        "dynamic_global_batch_size": dynamic,
        "trimmed": len(rows) - len(kept),
        "equal_reward_groups": equal_reward_groups,
    }


# --- rollout metrics (miles/ray/rollout/metrics.py) ----------------------------------
#
# miles' rollout manager logs these over the step's samples before the trim, one Sample
# at a time; `rollout/raw_reward` is the trainer's mean of the raw rewards. Ours:
# zero_std_ratio, rank_tokens/max_over_mean, untrained_ratio, and mixed_version_ratio
# beside non-numeric versions.


def compute_statistics(values: list[float]) -> dict[str, float]:
    """miles.utils.metric_utils.compute_statistics."""
    array = np.array(values)
    return {
        "mean": np.mean(array).item(),
        "median": np.median(array).item(),
        "max": np.max(array).item(),
        "min": np.min(array).item(),
    }


def effective_response_length(row: Row) -> int:
    """Sample.effective_response_length: the mask total, or the response length."""
    mask = row.get("loss_mask")
    return sum(mask) if mask is not None else row["response_length"]


def weight_versions_of(row: Row) -> list[str]:
    """A row's versions in call order: its strings (miles before PR #1891), or the
    version of every span of every call (`Sample.all_weight_version_spans` since)."""
    calls = row.get("weight_version_spans") or []
    return [span["version"] for call in calls for span in call] or list(
        row.get("weight_versions") or []
    )


def oldest_weight_version(row: Row) -> int | None:
    """Sample.oldest_weight_version (digit strings only)."""
    numeric = [int(v) for v in weight_versions_of(row) if str(v).isdigit()]
    return min(numeric) if numeric else None


def zero_std_metrics(rows: list[Row], settings: dict[str, Any]) -> dict[str, float]:
    """miles' _compute_zero_std_metrics, with our zero_std_ratio."""
    if settings["advantage_estimator"] == "ppo":
        return {}
    groups: dict[Any, list[float]] = {}
    for position, row in enumerate(rows):
        reward = get_reward_value(row, position, settings["reward_key"])
        groups.setdefault(row.get("group_index"), []).append(reward)
    counts: dict[str, int] = {}
    for rewards in groups.values():
        if all(rewards[0] == r for r in rewards):
            key = str(round(rewards[0], 1))
            counts[key] = counts.get(key, 0) + 1
    stats = {f"rollout/zero_std/count_{key}": float(n) for key, n in counts.items()}
    stats["rollout/zero_std/all_zero_percentage"] = counts.get("0.0", 0) / len(groups)
    stats["rollout/zero_std/all_one_percentage"] = counts.get("1.0", 0) / len(groups)
    stats["zero_std_ratio"] = sum(counts.values()) / len(groups)
    return stats


def reference_metrics(
    rows: list[Row], settings: dict[str, Any], untrained: int = 0
) -> dict[str, float]:
    """The `stats` of a step: its valid rows (batch order) and settings."""
    settings = effective_settings(settings)
    stats = {
        f"rollout/response_len/{k}": v
        for k, v in compute_statistics([effective_response_length(r) for r in rows]).items()
    }
    stats |= zero_std_metrics(rows, settings)
    stats["rollout/truncated_ratio"] = np.mean(
        [int(r["status"] == "truncated") for r in rows]
    ).item()
    raw = [
        r["raw_reward"]
        if r.get("raw_reward") is not None
        else get_reward_value(r, i, settings["reward_key"])
        for i, r in enumerate(rows)
    ]
    stats["rollout/raw_reward"] = sum(raw) / len(raw)
    oldest = [v for r in rows if (v := oldest_weight_version(r)) is not None]
    if oldest:
        stats |= {f"rollout/weight_version/{k}": v for k, v in compute_statistics(oldest).items()}
    if any(weight_versions_of(r) for r in rows):
        mixed = sum(1 for r in rows if len(set(weight_versions_of(r))) > 1)
        stats["rollout/weight_version/mixed_version_ratio"] = mixed / len(rows)
    ranks = reference_build([dict(r) for r in rows], settings)["ranks"]
    tokens = [sum(row["total_lengths"] for row in rank) for rank in ranks]
    written = sum(len(rank) for rank in ranks)
    stats["untrained_ratio"] = untrained / written if written else 0.0
    if sum(tokens):
        stats["rank_tokens/max_over_mean"] = max(tokens) / (sum(tokens) / len(tokens))
    return stats


# --- the trainer's rank dict (miles `_package_shards` + `process_rollout_data_shard`) ---

# Per-row keys as miles' _package_shards gathers them, batch-wide keys it copies whole.
MILES_ROW_KEYS = (
    "tokens",
    "response_lengths",
    "rewards",
    "truncated",
    "loss_masks",
    "round_number",
    "sample_indices",
    "rollout_ids",
    "rollout_mask_sums",
    "rollout_log_probs",
    "teacher_log_probs",
    "weight_versions",
)


def miles_train_data(batch_rows: list[Row]) -> dict[str, Any]:
    """The batch as miles' convert_samples_to_train_data leaves it (the keys the shards
    carry), from shard rows in batch order: one list per key, one entry per row."""
    data: dict[str, Any] = {}
    for key in MILES_ROW_KEYS:
        column = key
        if key == "weight_versions" and "weight_version_spans" in batch_rows[0]:
            column = "weight_version_spans"  # per call, the spans' to_dicts (miles #1891)
        if column not in batch_rows[0]:
            continue
        values = [row[column] for row in batch_rows]
        if column == "weight_version_spans":
            values = [[[dict(span) for span in call] for call in v or []] for v in values]
        if key == "weight_versions":  # Sample.weight_versions defaults to []
            values = [list(v) if v is not None else [] for v in values]
        if key in ("rollout_log_probs", "teacher_log_probs"):  # list<float32> in the input
            values = [[float(np.float32(x)) for x in v] if v is not None else None for v in values]
        if key == "rewards":
            values = [float(v) for v in values]
        data[key] = values
    data["raw_reward"] = [float(row["raw_reward"]) for row in batch_rows]
    return data


def miles_rank_dict(
    batch_rows: list[Row],
    partition: list[int],
    *,
    dynamic_global_batch_size: int | None = None,
    schedule: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What miles' trainer holds for the rank whose rows are `partition` (batch positions in
    its training order): per-row keys gathered, raw_reward for the whole batch,
    total_lengths in the rank's order; with the schedule its three keys."""
    data = miles_train_data(batch_rows)
    data["total_lengths"] = [len(row["tokens"]) for row in batch_rows]
    if dynamic_global_batch_size is not None:
        data["dynamic_global_batch_size"] = dynamic_global_batch_size
    shard: dict[str, Any] = {"partition": partition}
    for key in MILES_ROW_KEYS:
        if key in data:
            shard[key] = [data[key][j] for j in partition]
    for key in ("raw_reward", "total_lengths", "dynamic_global_batch_size"):
        if key in data:
            shard[key] = data[key]
    if schedule is not None:
        shard["num_microbatches"] = schedule["num_microbatches"]
        shard["micro_batch_indices"] = schedule["micro_batch_indices"]
        shard["num_rollouts"] = schedule["num_rollouts"]
    whole = shard.pop("partition")
    shard["total_lengths"] = [shard["total_lengths"][i] for i in whole]
    return shard


def micro_batch_runs(train_steps: list[int], micro_batches: list[int]) -> list[list[int]]:
    """miles' micro_batch_indices[rank] from a rank's rows: local positions of each
    (train step, micro-batch), in the rank's order."""
    runs: list[list[int]] = []
    previous = None
    for local, key in enumerate(zip(train_steps, micro_batches, strict=True)):
        if key != previous:
            runs.append([])
            previous = key
        runs[-1].append(local)
    return runs


# --- balance_by_flops: one row's forward FLOPs (miles' flops_utils, per sample) ---------


def forward_flops(lengths: Sequence[int], args: Any) -> list[float]:
    """Each length's forward FLOPs in Python arithmetic, one row at a time, from miles'
    args (Megatron's names, every default filled): the QKV projections, causal attention,
    the output projection and a gated MLP per layer, then the LM head."""
    h, heads, groups = args.hidden_size, args.num_attention_heads, args.num_query_groups
    kv, qk, pos, v = args.kv_channels, args.qk_head_dim, args.qk_pos_emb_head_dim, args.v_head_dim
    layers: list[tuple[int, int]] = [(args.ffn_hidden_size, args.num_layers)]
    if args.num_experts is not None:
        expert = args.moe_ffn_hidden_size * args.moe_router_topk
        expert += args.moe_shared_expert_intermediate_size or 0
        freq = args.moe_layer_freq
        pattern = (
            freq if isinstance(freq, list) else [int(i % freq == 0) for i in range(args.num_layers)]
        )
        layers = [
            (args.ffn_hidden_size, pattern.count(0)),
            (expert, len(pattern) - pattern.count(0)),
        ]
    out = []
    for s in lengths:
        if args.q_lora_rank is None:
            q = 2 * s * h * heads * kv
        else:
            q = 2 * s * args.q_lora_rank * (h + heads * (qk + pos))
        if args.kv_lora_rank is None:
            kvp = 4 * s * h * groups * kv
        else:
            kvp = 2 * s * (args.kv_lora_rank * (h + heads * (qk + v)) + h * pos)
        attention = heads * s * s * (qk + pos if pos else kv) / 1  # one rounding, as x*2/2
        attention = attention + float(heads * s * s * (v if v else kv))
        total: float = 0
        for ffn, count in layers:
            if count:
                layer = float(q + kvp) + attention + float(2 * s * h * h)
                total = total + (layer + float(6 * s * h * ffn)) * count
        out.append(total + float(2 * s * h * args.vocab_size))
    return out


# --- max_weight_staleness: miles' buffer filter, per group --------------------------


def stale_groups(rows: list[Row], step: int, budget: int) -> list[Any]:
    """The group_index of each group the buffer sets aside: its rows' oldest numeric
    weight version lags `step` by more than `budget` (a group with none is kept)."""
    oldest: dict[Any, int | None] = {}
    for row in rows:
        group = row["group_index"]
        mine = oldest_weight_version(row)
        have = oldest.get(group)
        oldest[group] = mine if have is None else have if mine is None else min(have, mine)
    return [
        group
        for group, version in oldest.items()
        if version is not None and step - version > budget
    ]


# --- slime (THUDM/slime at the pinned commit): rows -> the rank dicts its trainer holds --
#
# Written from reading slime's `RolloutManager` (`_get_rollout_data`,
# `_convert_samples_to_train_data`, `_post_process_rewards`, `_split_train_data_by_dp`),
# `slime/utils/dp_schedule.py`, `slime/utils/seqlen_balancing.py`,
# `slime/utils/flops_utils.py` and `slime/utils/data.py:process_rollout_data`; none of it is
# imported. Tensors are `SlimeTensor(dtype, values)`, dtype named as torch names it.

SLIME_DEFAULTS: dict[str, Any] = {
    "global_batch_size": None,
    "rollout_batch_size": None,
    "n_samples_per_prompt": 1,
    "advantage_estimator": "grpo",
    "rewards_normalization": True,
    "grpo_std_normalization": True,
    "reward_key": None,
    "micro_batch_size": 1,
    "use_dynamic_batch_size": False,
    "max_tokens_per_gpu": None,
    "balance_data": False,
    "balance_by_flops": False,
    "dp_size": 1,
    "cp_size": 1,
    "vpp_size": 1,
    "microbatch_group_size_per_vp_stage": 1,
    "num_experts": None,
    "moe_shared_expert_intermediate_size": None,
}
SLIME_NORMALIZED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
SLIME_STD = ("grpo", "gspo", "cispo")
# per-row keys in the order slime's `_split_train_data_by_dp` gathers them: miles' up to
# rollout_log_probs, then source_names and teacher_log_probs (no weight_versions)
SLIME_ROW_KEYS = (
    *MILES_ROW_KEYS[: MILES_ROW_KEYS.index("rollout_log_probs") + 1],
    "source_names",
    "teacher_log_probs",
)


class SlimeTensor(tuple):  # type: ignore[type-arg]
    """A tensor slime's trainer would hold: (dtype name, values as Python numbers)."""

    def __new__(cls, dtype: str, values: list[Any]) -> SlimeTensor:
        return super().__new__(cls, (dtype, values))


def slime_settings(settings: dict[str, Any]) -> dict[str, Any]:
    merged = {**SLIME_DEFAULTS, **{k: v for k, v in settings.items() if v is not None}}
    if merged["balance_by_flops"]:
        if not merged["use_dynamic_batch_size"]:
            raise ValueError("--balance-by-flops requires --use-dynamic-batch-size")
        merged["balance_data"] = True
    if merged["use_dynamic_batch_size"] and merged["max_tokens_per_gpu"] is None:
        raise ValueError("max_tokens_per_gpu must be set when use_dynamic_batch_size is set")
    if merged["n_samples_per_prompt"] == 1:
        merged["grpo_std_normalization"] = False
    return merged


def check_slime_rollout_ids(rows: list[Row]) -> None:
    """slime's `validate_rollout_id_annotated` on the table: the leaves of one generate
    call (rows sharing `index`) that are several must all carry one `rollout_id`."""
    calls: dict[int, list[int]] = {}
    for position, row in enumerate(rows):
        calls.setdefault(row["index"], []).append(position)
    for positions in calls.values():
        if len(positions) < 2:
            continue
        ids = [rows[p].get("rollout_id") for p in positions]
        if any(i is None for i in ids):
            raise ValueError(f"rows {positions}: a multi-leaf call with rollout_id unset")
        if len(set(ids)) != 1:
            raise ValueError(f"rows {positions}: siblings with rollout ids {ids}")


def torch_welford_std(values: Sequence[np.float32]) -> np.float32:
    """`t.std(dim=-1)` on the CPU for one row: Welford in float64, value by value, Bessel's
    correction, the square root in float64 rounded to float32 (NaN for one value)."""
    mean = 0.0
    m2 = 0.0
    for n, value in enumerate(values, start=1):
        x = float(value)
        delta = x - mean
        mean = mean + delta / float(n)
        m2 = m2 + delta * (x - mean)
    divisor = len(values) - 1
    if divisor <= 0:
        return np.float32(math.nan)
    return np.float32(math.sqrt(m2 / divisor))


def slime_rewards(rows: list[Row], s: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """(raw rewards, rewards) as `_post_process_rewards` returns them: groups by position
    (n_samples_per_prompt consecutive rows when the batch is n * rollout_batch_size rows,
    else one group), float32 arithmetic, std + 1e-6 with no zero-std special case."""
    key = s["reward_key"]
    raw = [row["reward"][key] if key else row["reward"] for row in rows]
    if not (s["advantage_estimator"] in SLIME_NORMALIZED and s["rewards_normalization"]):
        return raw, raw
    n = s["n_samples_per_prompt"]
    width = n if len(rows) == n * s["rollout_batch_size"] else len(rows)
    out: list[float] = []
    for start in range(0, len(rows), width):
        group = [np.float32(v) for v in raw[start : start + width]]
        mean = torch_f32_mean(group)
        centered = [np.float32(v - mean) for v in group]
        if s["advantage_estimator"] in SLIME_STD and s["grpo_std_normalization"]:
            denominator = np.float32(torch_welford_std(centered) + np.float32(1e-6))
            centered = [np.float32(v / denominator) for v in centered]
        out.extend(float(v) for v in centered)
    return raw, out


def fill_rollout_ids(ids: list[int | None]) -> list[int]:
    """Each missing id becomes the smallest integer not yet used, in batch order."""
    used = {i for i in ids if i is not None}
    filled: list[int] = []
    candidate = 0
    for rollout_id in ids:
        if rollout_id is None:
            while candidate in used:
                candidate += 1
            used.add(candidate)
            rollout_id = candidate
        filled.append(rollout_id)
    return filled


def slime_source_name(row: Row) -> Any:
    import json

    metadata = json.loads(row["metadata"]) if row.get("metadata") is not None else {}
    return metadata.get("source_name") or "unknown"


def slime_train_data(rows: list[Row], s: dict[str, Any]) -> dict[str, list[Any]]:
    """The batch as `_convert_samples_to_train_data` leaves it."""
    check_slime_rollout_ids(rows)
    raw, rewards = slime_rewards(rows, s)
    masks = []
    for row in rows:
        mask = row.get("loss_mask")
        mask = [1] * row["response_length"] if mask is None else list(mask)
        if len(mask) != row["response_length"]:
            raise ValueError("loss mask length != response length")
        masks.append([0] * row["response_length"] if row.get("remove_sample") else mask)
    ids = fill_rollout_ids([row.get("rollout_id") for row in rows])
    totals: dict[int, int] = {}
    for rollout_id, mask in zip(ids, masks, strict=True):
        totals[rollout_id] = totals.get(rollout_id, 0) + sum(mask)
    data: dict[str, list[Any]] = {
        "tokens": [list(row["tokens"]) for row in rows],
        "response_lengths": [row["response_length"] for row in rows],
        "rewards": rewards,
        "raw_reward": raw,
        "truncated": [1 if row["status"] == "truncated" else 0 for row in rows],
        "sample_indices": [row["index"] for row in rows],
        "rollout_ids": ids,
        "loss_masks": masks,
        "rollout_mask_sums": [totals[i] for i in ids],
    }
    if any(row.get("raw_reward") is not None for row in rows):
        data["raw_reward"] = [
            row["raw_reward"] if row.get("raw_reward") is not None else row["reward"]
            for row in rows
        ]
    for column, key in (
        ("round_number", "round_number"),
        ("rollout_log_probs", "rollout_log_probs"),
        ("teacher_log_probs", "teacher_log_probs"),
    ):
        if rows[0].get(column) is not None:
            data[key] = [row[column] for row in rows]
    data["source_names"] = [slime_source_name(row) for row in rows]
    return data


def slime_fwd_flops(length: int, s: dict[str, Any]) -> float:
    """One sample's forward FLOPs as `calculate_fwd_flops([length], args)` estimates them
    (standard attention, no multi-latent attention), in its order of operations."""
    h, heads, groups = s["hidden_size"], s["num_attention_heads"], s["num_query_groups"]
    kv = s["kv_channels"]

    def layer(ffn: int) -> Any:
        qkv = 2 * length * h * heads * kv + 2 * 2 * length * h * groups * kv
        attention = 2 * heads * length * length * kv / 2
        attention += heads * length * length * kv
        return qkv + attention + 2 * length * h * h + 2 * length * h * ffn * 3

    if s["num_experts"] is None:
        dense, moe, moe_ffn = s["num_layers"], 0, 0
    else:
        shared = s["moe_shared_expert_intermediate_size"] or 0
        dense, moe = 0, s["num_layers"]  # Megatron's moe_layer_freq 1: every layer
        moe_ffn = s["moe_ffn_hidden_size"] * s["moe_router_topk"] + shared
    total: Any = 0
    if dense:
        total += layer(s["ffn_hidden_size"]) * dense
    if moe:
        total += layer(moe_ffn) * moe
    return total + 2 * length * h * s["vocab_size"]


def largest_differencing(values: list[Any], k: int, equal_size: bool) -> list[list[int]]:
    """Karmarkar-Karp as SEMANTICS 7.3 states it, each partition sorted ascending."""
    if len(values) < k:
        raise ValueError(f"{len(values)} items for {k} partitions")

    def ordered(sets: list[tuple[Any, list[tuple[int, Any]]]]) -> list[Any]:
        return sorted(sets, key=lambda st: (st[0], len(st[1]), st[1]), reverse=True)

    items = sorted((v, i) for i, v in enumerate(values))
    if equal_size:
        if len(values) % k:
            raise ValueError(f"{len(values)} items do not split into {k} equal parts")
        chunks = [items[o : o + k] for o in range(0, len(items), k)]
    else:
        chunks = [[item] for item in items]
    states = []
    for chunk in chunks:
        sets: list[tuple[Any, list[tuple[int, Any]]]] = [(0, []) for _ in range(k)]
        for slot, (v, i) in enumerate(chunk):
            sets[slot] = (v, [(i, v)])
        states.append(ordered(sets))

    def pop_first(pool: list[list[Any]]) -> list[Any]:
        def rank(st: list[Any]) -> tuple[Any, ...]:
            return (st[0][0] - st[-1][0], st[0][0], len(st[0][1]), st[0][1])

        best = max(range(len(pool)), key=lambda j: rank(pool[j]))
        return pool.pop(best)

    while len(states) > 1:
        a = pop_first(states)
        b = pop_first(states)
        merged = []
        for j in range(k):
            total, items = a[j][0], list(a[j][1])
            for i, v in b[k - 1 - j][1]:  # slime adds the items one by one
                items.append((i, v))
                total += v
            merged.append((total, items))
        states.append(ordered(merged))
    parts = [sorted(i for i, _ in st[1]) for st in states[0]]
    if any(not p for p in parts):
        raise ValueError("an empty partition")
    return parts


def first_fit(lengths: list[int], cap: int) -> list[list[int]]:
    """Rows in order, each into the first bin it fits in (slime packs without sorting)."""
    bins: list[list[int]] = []
    sums: list[int] = []
    for i, length in enumerate(lengths):
        for j in range(len(bins)):
            if sums[j] + length <= cap:
                bins[j].append(i)
                sums[j] += length
                break
        else:
            bins.append([i])
            sums.append(length)
    return bins


def split_until(bins: list[list[int]], target: int, lengths: list[int]) -> None:
    """Split the heaviest bin of two or more rows (ties: the later bin) into two halves,
    rows by length descending each to the lighter half, until `target` bins."""
    while len(bins) < target:
        heavy = [(sum(lengths[i] for i in b), j) for j, b in enumerate(bins) if len(b) > 1]
        if not heavy:
            return
        _, j = max(heavy)
        halves: list[list[int]] = [[], []]
        sums = [0, 0]
        for i in sorted(bins[j], key=lambda i: -lengths[i]):
            side = 0 if sums[0] <= sums[1] else 1
            halves[side].append(i)
            sums[side] += lengths[i]
        bins[j] = halves[0]
        bins.append(halves[1])


def slime_schedule(
    lengths: list[int], ids: list[int], s: dict[str, Any]
) -> tuple[list[list[int]], list[list[list[int]]], list[int], list[int]]:
    """(partitions, micro_batch_indices, num_microbatches, global_batch_sizes)."""
    dp, gbs = s["dp_size"], s["global_batch_size"]
    align = dp * (s["microbatch_group_size_per_vp_stage"] if s["vpp_size"] > 1 else 1)
    cap = s["max_tokens_per_gpu"] * s["cp_size"] if s["use_dynamic_batch_size"] else None
    rollouts: dict[int, list[int]] = {}
    for position, rollout_id in enumerate(ids):
        rollouts.setdefault(rollout_id, []).append(position)
    order = list(rollouts)
    steps = len(order) // gbs
    if steps < 1:
        raise ValueError(f"{len(order)} rollouts < global_batch_size {gbs}")
    partitions: list[list[int]] = [[] for _ in range(dp)]
    micro: list[list[list[int]]] = [[] for _ in range(dp)]
    counts: list[int] = []
    for step in range(steps):
        rows = [p for rid in order[step * gbs : (step + 1) * gbs] for p in rollouts[rid]]
        step_lengths = [lengths[p] for p in rows]
        if len(rows) < dp:
            raise ValueError(f"step {step}: {len(rows)} rows < dp {dp}")
        if cap is None:
            size = s["micro_batch_size"]
            bins = [list(range(i, min(i + size, len(rows)))) for i in range(0, len(rows), size)]
        elif s["balance_by_flops"]:
            wanted = max(1, (sum(step_lengths) + cap - 1) // cap)
            if wanted >= len(rows):
                bins = [[i] for i in range(len(rows))]
            else:
                flops = [slime_fwd_flops(n, s) for n in step_lengths]
                bins = largest_differencing(flops, wanted, equal_size=False)
        else:
            bins = first_fit(step_lengths, cap)
        target = max(-(-len(bins) // align) * align, align)
        if target != len(bins):
            if cap is None:
                raise ValueError(f"static: {len(bins)} micro-batches not a multiple of {align}")
            split_until(bins, target, step_lengths)
            if len(bins) != target:
                raise ValueError(f"dynamic: {len(bins)} micro-batches, need {target}")
        counts.append(len(bins) // dp)
        if s["balance_data"]:
            flops = [slime_fwd_flops(n, s) for n in step_lengths]
            weights = [sum(flops[i] for i in b) for b in bins]
            owners = largest_differencing(weights, dp, equal_size=True)
        else:
            owners = [list(range(r, len(bins), dp)) for r in range(dp)]
        for r in range(dp):
            for b in owners[r]:
                start = len(partitions[r])
                partitions[r].extend(rows[i] for i in bins[b])
                micro[r].append(list(range(start, start + len(bins[b]))))
    return partitions, micro, counts, [gbs] * steps


def slime_rank_dicts(rows: list[Row], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Each rank's dict after slime's `process_rollout_data`."""
    s = slime_settings(settings)
    data = slime_train_data(rows, s)
    lengths = [len(t) for t in data["tokens"]]
    partitions, micro, counts, sizes = slime_schedule(lengths, data["rollout_ids"], s)
    tensors = {
        "tokens": "torch.int64",
        "loss_masks": "torch.int32",
        "rollout_log_probs": "torch.float32",
        "teacher_log_probs": "torch.float32",
    }
    out = []
    for r, partition in enumerate(partitions):
        shard: dict[str, Any] = {"partition": partition}
        for key in SLIME_ROW_KEYS:
            if key not in data:
                continue
            values = [data[key][j] for j in partition]
            if key in tensors:
                if key.endswith("log_probs"):
                    values = [[float(np.float32(x)) for x in v] for v in values]
                values = [SlimeTensor(tensors[key], v) for v in values]
            elif key == "rollout_mask_sums":
                values = SlimeTensor("torch.float32", [float(v) for v in values])
            shard[key] = values
        shard["raw_reward"] = data["raw_reward"]
        shard["total_lengths"] = [lengths[j] for j in partition]
        shard["global_batch_sizes"] = sizes
        shard["num_microbatches"] = counts
        shard["micro_batch_indices"] = micro[r]
        shard["local_raw_reward"] = [data["raw_reward"][j] for j in partition]
        out.append(shard)
    return out


# --- verl 0.9.1 (RayPPOTrainer.fit, GRPO): the DataProto each data-parallel rank gets ---
#
# From reading verl/experimental/agent_loop/agent_loop.py (_agent_loop_postprocess,
# _postprocess), verl/trainer/ppo/ray_trainer.py (fit, _balance_batch, compute_advantage),
# verl/utils/seqlen_balancing.py and verl/trainer/ppo/core_algos.py
# (compute_grpo_outcome_advantage). One dict per sample, numpy at the end.

VERL_EPSILON = np.float32(1e-6)


def verl_padded_sample(row: Row, settings: dict[str, Any]) -> dict[str, Any]:
    """One sample as the agent loop pads it: the prompt left-padded to max_prompt_length,
    the response right-padded to max_response_length, the score at the last response
    token (the last column when the response is empty)."""
    pad = settings["pad_token_id"]
    max_prompt, max_response = settings["max_prompt_length"], settings["max_response_length"]
    tokens, length = list(row["tokens"]), row["response_length"]
    prompt, response = tokens[: len(tokens) - length], tokens[len(tokens) - length :]
    mask = [1] * length if row.get("loss_mask") is None else list(row["loss_mask"])
    prompt_pad, response_pad = max_prompt - len(prompt), max_response - length
    attention = [0] * prompt_pad + [1] * len(prompt) + [1] * length + [0] * response_pad
    positions, seen = [], 0
    for a in attention:
        seen += a
        positions.append(max(seen - 1, 0))
    scores = [np.float32(0.0)] * max_response
    scores[(length - 1) % max_response] = np.float32(row["reward"])
    out: dict[str, Any] = {
        "prompts": [pad] * prompt_pad + prompt,
        "responses": response + [pad] * response_pad,
        "response_mask": mask + [0] * response_pad,
        "input_ids": [pad] * prompt_pad + prompt + response + [pad] * response_pad,
        "attention_mask": attention,
        "position_ids": positions,
        "scores": scores,
        "uid": str(row["group_index"]),
    }
    if row.get("rollout_log_probs") is not None:
        out["rollout_log_probs"] = [np.float32(x) for x in row["rollout_log_probs"]] + [
            np.float32(0.0)
        ] * response_pad
    return out


def verl_largest_differencing(values: list[int], k: int) -> list[list[int]]:
    """verl's karmarkar_karp(equal_size=True): states of k items each (ascending by
    value, then position), merged largest spread first; sets compare by (sum, size,
    items); the partitions in the final state's order, each sorted."""
    ranked = sorted((v, i) for i, v in enumerate(values))

    def sort_sets(sets: list[list[Any]]) -> list[list[Any]]:
        return sorted(sets, key=lambda s: (s[0], len(s[1]), s[1]), reverse=True)

    states = []
    for start in range(0, len(ranked), k):
        sets = [[v, [(i, v)]] for v, i in ranked[start : start + k]]
        states.append(sort_sets(sets))

    def priority(state: list[list[Any]]) -> tuple[Any, ...]:
        first = state[0]
        return (first[0] - state[-1][0], (first[0], len(first[1]), first[1]))

    while len(states) > 1:
        # pop the largest spread, ties to the larger first set (a min-heap on the inverse)
        states.sort(key=priority, reverse=True)
        a, b = states.pop(0), states.pop(0)
        merged = [[a[i][0] + b[k - 1 - i][0], a[i][1] + b[k - 1 - i][1]] for i in range(k)]
        states.append(sort_sets(merged))
    return [sorted(i for i, _ in s[1]) for s in states[0]]


def verl_balanced_order(lengths: list[int], dp_size: int) -> list[int]:
    """_balance_batch's order: partitions of the workload 24576 L + L^2, each sorted by
    (workload, position) and laid out smallest at both ends."""
    workload = [24576 * n + n * n for n in lengths]
    order: list[int] = []
    for part in verl_largest_differencing(workload, dp_size):
        part = sorted(part, key=lambda i: (workload[i], i))
        order.extend(part[::2] + part[1::2][::-1])
    return order


def verl_grpo(samples: list[dict[str, Any]], norm_by_std: bool) -> list[np.float32]:
    """compute_grpo_outcome_advantage per sample: the score against its uid group's mean
    (and std), groups of one taken as mean 0 and std 1."""
    scores = [np.float32(0.0) + np.float32(sum(s["scores"], np.float32(0.0))) for s in samples]
    groups: dict[str, list[np.float32]] = {}
    for s, score in zip(samples, scores, strict=True):
        groups.setdefault(s["uid"], []).append(score)
    stats = {
        uid: (np.float32(0.0), np.float32(1.0))
        if len(values) == 1
        else (torch_f32_mean(values), torch_f32_std(values))
        for uid, values in groups.items()
    }
    out = []
    for s, score in zip(samples, scores, strict=True):
        mean, std = stats[s["uid"]]
        centered = np.float32(score - mean)
        out.append(
            np.float32(centered / np.float32(std + VERL_EPSILON)) if norm_by_std else centered
        )
    return out


def verl_reference(rows: list[Row], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Per rank: each batch tensor as a numpy array (verl's dtypes), `uid` and
    `global_token_num`, for a step whose rows come in prompt groups of rollout_n."""
    dp = settings["dp_size"]
    samples = [verl_padded_sample(row, settings) for row in rows]
    lengths = [sum(s["attention_mask"]) for s in samples]
    order = list(range(len(samples)))
    if settings["balance_batch"]:
        order = verl_balanced_order(lengths, dp)
    samples = [samples[i] for i in order]
    advantages = verl_grpo(samples, settings["norm_adv_by_std_in_grpo"])
    per_rank = len(samples) // dp
    ranks = []
    for r in range(dp):
        chosen = range(r * per_rank, (r + 1) * per_rank)
        batch: dict[str, Any] = {"dummy_tensor": np.zeros((per_rank, 1), dtype=np.uint8)}
        for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask"):
            batch[key] = np.array([samples[i][key] for i in chosen], dtype=np.int64)
        batch["position_ids"] = np.array([samples[i]["position_ids"] for i in chosen], np.int64)
        if "rollout_log_probs" in samples[0]:
            batch["rollout_log_probs"] = np.array(
                [samples[i]["rollout_log_probs"] for i in chosen], dtype=np.float32
            )
        scores = np.array([samples[i]["scores"] for i in chosen], dtype=np.float32)
        batch["rm_scores"] = scores
        batch["token_level_scores"] = scores
        batch["token_level_rewards"] = scores
        mask = batch["response_mask"].astype(np.float32)
        advantage = np.array([advantages[i] for i in chosen], dtype=np.float32)[:, None] * mask
        batch["advantages"] = advantage
        batch["returns"] = advantage
        ranks.append(
            {
                "batch": batch,
                "uid": [samples[i]["uid"] for i in chosen],
                "global_token_num": [lengths[i] for i in order],
            }
        )
    return ranks
