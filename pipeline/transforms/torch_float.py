"""Group means and stds in torch's CPU float32 arithmetic, bit for bit (SEMANTICS 5.3).

miles normalizes rewards with torch float32 tensors. torch's CPU sum is not sequential:
below 8 values it keeps four partial sums; from 8 values on it adds 8-wide vectors into
four accumulators (aten/src/ATen/native/cpu/SumKernel.cpp, cascade_sum), then a scalar
tail, then the lanes in order. Reproducing that order gives the trainer's exact bits,
so a payload built here compares bitwise with miles' own.

Every function works on groups of one size laid out group after group (a matrix with
one row per group, as a flat Polars Series): each term of torch's order of additions
is one float32 Series operation over all the groups at once, so the Python loops run
over positions within a group, never over groups or rows. Not modelled: torch splits a
sum of 32768 values or more across threads.
"""

from __future__ import annotations

import math

import polars as pl

VECTOR_WIDTH = 8
LEVELS = 4


def _ceil_log2(x: int) -> int:
    return 1 if x <= 2 else (x - 1).bit_length()


def _multi_row_sum(rows: list[list[pl.Series]], zero: pl.Series) -> list[pl.Series]:
    """aten's multi_row_sum with 4 columns: a 4-level cascade of 4 accumulators."""
    size = len(rows)
    level_power = max(4, _ceil_log2(size) // LEVELS)
    level_step = 1 << level_power
    level_mask = level_step - 1
    acc = [[zero] * 4 for _ in range(LEVELS)]
    i = 0
    while i + level_step <= size:
        for _ in range(level_step):
            acc[0] = [acc[0][k] + rows[i][k] for k in range(4)]
            i += 1
        for j in range(1, LEVELS):
            acc[j] = [acc[j][k] + acc[j - 1][k] for k in range(4)]
            acc[j - 1] = [zero] * 4
            if i & (level_mask << (j * level_power)):
                break
    while i < size:
        acc[0] = [acc[0][k] + rows[i][k] for k in range(4)]
        i += 1
    for j in range(1, LEVELS):
        acc[0] = [acc[0][k] + acc[j][k] for k in range(4)]
    return acc[0]


def _row_sum(items: list[pl.Series], zero: pl.Series) -> pl.Series:
    """aten's row_sum: items in rows of 4 into multi_row_sum, leftovers to the first sum."""
    size_ilp = len(items) // 4
    partial = _multi_row_sum([items[4 * i : 4 * i + 4] for i in range(size_ilp)], zero)
    for item in items[size_ilp * 4 :]:
        partial[0] = partial[0] + item
    for k in range(1, 4):
        partial[0] = partial[0] + partial[k]
    return partial[0]


def _range(n: int) -> pl.Series:
    return pl.int_range(n, dtype=pl.Int64, eager=True)


def torch_sums(x: pl.Series, n: int) -> pl.Series:
    """Sums of the float32 groups of `n` values in `x` (group after group), each as
    torch's `tensor.sum()`."""
    groups = len(x) // n
    starts = _range(groups) * n
    zero = pl.zeros(groups, pl.Float32, eager=True)
    if n < VECTOR_WIDTH:
        total = _row_sum([x.gather(starts + j) for j in range(n)], zero)
    else:
        # item v: the 8-wide vector of values 8v .. 8v + 7 of every group, group by group;
        # gathered at once, item after item, and sliced (a slice copies nothing)
        vectors = n // VECTOR_WIDTH
        width = groups * VECTOR_WIDTH
        entry = _range(vectors * width)
        item, within = entry // width, entry % width
        by_item = x.gather(within // VECTOR_WIDTH * n + item * VECTOR_WIDTH + within % VECTOR_WIDTH)
        items = [by_item.slice(v * width, width) for v in range(vectors)]
        lanes = _row_sum(items, pl.zeros(groups * VECTOR_WIDTH, pl.Float32, eager=True))
        total = zero
        for j in range(vectors * VECTOR_WIDTH, n):
            total = total + x.gather(starts + j)
        first_lane = _range(groups) * VECTOR_WIDTH
        for lane in range(VECTOR_WIDTH):
            total = total + lanes.gather(first_lane + lane)
    return zero + total


def torch_mean_std(x: pl.Series, n: int) -> tuple[pl.Series, pl.Series]:
    """Per group of `n` values of the float32 `x`, `tensor.mean()` and `tensor.std()` (Bessel).

    The mean is the float32 sum divided by n in float32; the std accumulates squared
    deviations from that mean in float64, in order, and rounds the root to float32.
    """
    groups = len(x) // n
    # Polars divides by a scalar as a multiplication by its reciprocal (other bits):
    # every division here is by a Series of the divisor
    mean = torch_sums(x, n) / pl.repeat(n, groups, dtype=pl.Float32, eager=True)
    if n == 1:
        return mean, pl.repeat(float("nan"), groups, dtype=pl.Float32, eager=True)
    # the squared deviations from the float32 mean, in float64, summed in order per group
    group = _range(groups * n) // n
    deviations = x.cast(pl.Float64) - mean.cast(pl.Float64).gather(group)
    squares = (
        (deviations * deviations)
        .reshape((groups, n))
        .cast(pl.List(pl.Float64))
        .list.eval(pl.element().cum_sum().last())  # a cumulative sum is sequential
        .list.first()
    )
    variance = squares / pl.repeat(n - 1, groups, dtype=pl.Float64, eager=True)
    return mean, variance.sqrt().cast(pl.Float32)


def grouped_mean_std(values: pl.Series, sizes: pl.Series) -> tuple[pl.Series, pl.Series]:
    """Mean and std (float32, one value per group) of a float32 Series laid out group after
    group, given the groups' sizes in order."""
    sizes = sizes.cast(pl.Int64)
    groups = pl.DataFrame({"n": sizes, "start": sizes.cum_sum() - sizes}).with_row_index("group")
    parts = []
    for n in sorted(sizes.unique().to_list()):
        chosen = groups.filter(pl.col("n") == n)
        positions = _range(chosen.height * n)
        rows = chosen.get_column("start").gather(positions // n) + positions % n
        mean, std = torch_mean_std(values.gather(rows), n)
        parts.append(chosen.select("group").with_columns(mean=mean, std=std))
    if not parts:
        empty = pl.Series([], dtype=pl.Float32)
        return empty, empty
    result = pl.concat(parts).sort("group")
    return result.get_column("mean"), result.get_column("std")


def torch_dim_std(x: pl.Series, n: int) -> pl.Series:
    """Per group of `n` values of the float32 `x`, `t.std(dim=-1)` of the groups as rows of
    a 2-D tensor (Bessel; NaN for one value): on the CPU a reduction over one dimension is
    Welford's in float64, value after value (`std_var_kernel_impl`), not the two-pass
    `tensor.std()` of the whole tensor. The recurrence runs over the positions within a
    group, on all groups at once."""
    import numpy as np

    groups = len(x) // n
    if groups < n:  # few long groups: the recurrence on Python floats, group by group
        return pl.Series([_welford_std(part) for part in _parts(x, n)], dtype=pl.Float32)
    values = x.cast(pl.Float64).to_numpy().reshape(groups, n)
    mean = np.zeros(groups)
    m2 = np.zeros(groups)
    for count, column in enumerate(values.T, start=1):
        delta = column - mean
        mean = mean + delta / float(count)
        m2 = m2 + delta * (column - mean)
    with np.errstate(invalid="ignore", divide="ignore"):
        variance = m2 / float(n - 1) if n > 1 else np.full(groups, np.nan)
    return pl.Series(np.sqrt(variance), dtype=pl.Float64).cast(pl.Float32)


def _parts(x: pl.Series, n: int) -> list[list[float]]:
    values: list[float] = x.cast(pl.Float64).to_list()
    return [values[start : start + n] for start in range(0, len(values), n)]


def _welford_std(values: list[float]) -> float:
    mean = 0.0
    m2 = 0.0
    for count, value in enumerate(values, start=1):
        delta = value - mean
        mean += delta / count
        m2 += delta * (value - mean)
    return math.sqrt(m2 / (len(values) - 1)) if len(values) > 1 else math.nan
