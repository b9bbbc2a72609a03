"""Group means and stds in torch's CPU float32 arithmetic, bit for bit (SEMANTICS 5.3).

miles normalizes rewards with torch float32 tensors. torch's CPU sum is not sequential:
below 8 values it keeps four partial sums; from 8 values on it adds 8-wide vectors into
four accumulators (aten/src/ATen/native/cpu/SumKernel.cpp, cascade_sum), then a scalar
tail, then the lanes in order. Reproducing that order gives the trainer's exact bits,
so a payload built here compares bitwise with miles' own.

Every function works on a matrix of groups of one size (one row per group), so the
Python loops run over positions within a group, never over groups or rows. Not
modelled: torch splits a sum of 32768 values or more across threads.
"""

from __future__ import annotations

import numpy as np

VECTOR_WIDTH = 8
LEVELS = 4


def _ceil_log2(x: int) -> int:
    return 1 if x <= 2 else (x - 1).bit_length()


def _multi_row_sum(rows: list[list[np.ndarray]], zero: np.ndarray) -> list[np.ndarray]:
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


def _row_sum(items: list[np.ndarray], zero: np.ndarray) -> np.ndarray:
    """aten's row_sum: items in rows of 4 into multi_row_sum, leftovers to the first sum."""
    size_ilp = len(items) // 4
    partial = _multi_row_sum([items[4 * i : 4 * i + 4] for i in range(size_ilp)], zero)
    for item in items[size_ilp * 4 :]:
        partial[0] = partial[0] + item
    for k in range(1, 4):
        partial[0] = partial[0] + partial[k]
    return partial[0]


def torch_sums(x: np.ndarray) -> np.ndarray:
    """Row sums of a float32 matrix [groups, n], each as torch's `tensor.sum()`."""
    groups, n = x.shape
    zero = np.zeros(groups, dtype=np.float32)
    if n < VECTOR_WIDTH:
        total = _row_sum([x[:, j] for j in range(n)], zero)
    else:
        vectors = n // VECTOR_WIDTH
        items = [x[:, v * VECTOR_WIDTH : (v + 1) * VECTOR_WIDTH] for v in range(vectors)]
        lanes = _row_sum(items, np.zeros((groups, VECTOR_WIDTH), dtype=np.float32))
        total = zero
        for j in range(vectors * VECTOR_WIDTH, n):
            total = total + x[:, j]
        for lane in range(VECTOR_WIDTH):
            total = total + lanes[:, lane]
    result: np.ndarray = zero + total
    return result


def torch_mean_std(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row `tensor.mean()` and `tensor.std()` (Bessel) of a float32 matrix.

    The mean is the float32 sum divided by n in float32; the std accumulates squared
    deviations from that mean in float64, in order, and rounds the root to float32.
    """
    n = x.shape[1]
    mean = (torch_sums(x) / np.float32(n)).astype(np.float32)
    deviations = x.astype(np.float64) - mean.astype(np.float64)[:, None]
    squares = np.cumsum(deviations * deviations, axis=1)[:, -1]  # sequential, as torch
    std = (
        np.sqrt(squares / max(n - 1, 1)).astype(np.float32)
        if n > 1
        else np.full(len(x), np.nan, dtype=np.float32)
    )
    return mean, std


def grouped_mean_std(values: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std per group of a float32 vector laid out group after group."""
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    mean = np.empty(len(sizes), dtype=np.float32)
    std = np.empty(len(sizes), dtype=np.float32)
    for n in np.unique(sizes):
        which = np.flatnonzero(sizes == n)
        matrix = values[starts[which][:, None] + np.arange(n)]
        mean[which], std[which] = torch_mean_std(matrix)
    return mean, std
