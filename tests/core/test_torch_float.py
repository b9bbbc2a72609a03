"""Group means and stds against torch itself, bit for bit, for every size up to 300."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.transforms.torch_float import grouped_mean_std, torch_mean_std, torch_sums


def test_sums_means_and_stds_match_torch() -> None:
    rng = np.random.default_rng(11)
    for n in [*range(1, 301), 511, 512, 513, 2049, 9000]:
        x = (rng.normal(size=(2, n)) * 10.0 ** rng.integers(-3, 4, (2, n))).astype(np.float32)
        sums = torch_sums(x)
        mean, std = torch_mean_std(x)
        for row in range(2):
            t = torch.from_numpy(x[row].copy())
            assert sums[row] == t.sum().item(), n
            assert mean[row] == t.mean().item(), n
            if n > 1:
                assert std[row] == t.std().item(), n


def test_groups_of_mixed_sizes_laid_out_one_after_another() -> None:
    values = np.array([1, 2, 3, 0.5, 0.25, 7, 7, 7, 7, 7, 7, 7, 7, 9], dtype=np.float32)
    sizes = np.array([3, 2, 8, 1])
    mean, std = grouped_mean_std(values, sizes)
    start = 0
    for group, n in enumerate(sizes):
        t = torch.from_numpy(values[start : start + n].copy())
        assert mean[group] == t.mean().item()
        if n > 1:
            assert std[group] == t.std().item()
        start += n
