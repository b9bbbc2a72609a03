"""Group means and stds against torch itself, bit for bit, for every size up to 300."""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from pipeline.transforms.torch_float import grouped_mean_std, torch_mean_std, torch_sums


def test_sums_means_and_stds_match_torch() -> None:
    rng = np.random.default_rng(11)
    sizes = [*range(1, 301), 511, 512, 513, 2049, 9000]
    for n in sizes:
        x = (rng.normal(size=(3, n)) * 10.0 ** rng.integers(-3, 4, (3, n))).astype(np.float32)
        flat = pl.Series(x.reshape(-1))
        sums = torch_sums(flat, n)
        mean, std = torch_mean_std(flat, n)
        assert sums.dtype == mean.dtype == std.dtype == pl.Float32
        for row in range(3):
            t = torch.from_numpy(x[row].copy())
            assert sums[row] == t.sum().item(), n
            assert mean[row] == t.mean().item(), n
            if n > 1:
                assert std[row] == t.std().item(), n


def test_a_division_is_true_division_not_by_the_reciprocal() -> None:
    """156.46918 / 3 in float32 is 52.15639; times float32(1/3) it is 52.156395, the
    bits Polars gives when it divides a Series by a scalar."""
    x = pl.Series([156.46917724609375, 0.0, 0.0, 1.0, 2.0, 3.0], dtype=pl.Float32)
    mean, _ = torch_mean_std(x, 3)
    assert mean.to_list() == [52.15639114379883, 2.0]
    assert torch.tensor([156.46917724609375, 0.0, 0.0]).mean().item() == 52.15639114379883


def test_groups_of_mixed_sizes_laid_out_one_after_another() -> None:
    values = np.array([1, 2, 3, 0.5, 0.25, 7, 7, 7, 7, 7, 7, 7, 7, 9], dtype=np.float32)
    sizes = [3, 2, 8, 1]
    mean, std = grouped_mean_std(pl.Series(values), pl.Series(sizes))
    assert len(mean) == len(std) == len(sizes)
    start = 0
    for group, n in enumerate(sizes):
        t = torch.from_numpy(values[start : start + n].copy())
        assert mean[group] == t.mean().item()
        if n > 1:
            assert std[group] == t.std().item()
        else:
            assert np.isnan(std[group])
        start += n
