"""The slime profile's pieces in `pipeline/transforms/` against the independent reference
(tests/reference.py) and torch: the rollout-id fill, torch's one-dimension std, first-fit
packing, largest differencing over float weights (FLOPs sums past 2**53), slime's FLOPs."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from pipeline.settings import load_settings
from pipeline.transforms.flops import forward_flops, slime_model_shape
from pipeline.transforms.packing import first_fit, karmarkar_karp
from pipeline.transforms.repair import filled_rollout_ids
from pipeline.transforms.torch_float import torch_dim_std
from tests import reference


@pytest.mark.parametrize(
    "ids",
    [
        [None, 0, None, 2, None],
        [None, None, None],
        [5, None, 1, 1, None],
        [-3, None, 0],
        [0, 1, 2],
    ],
)
def test_fill_takes_the_smallest_unused_integers(ids: list[int | None]) -> None:
    filled = filled_rollout_ids(pl.Series("rollout_id", ids, dtype=pl.Int64))
    assert filled.to_list() == reference.fill_rollout_ids(ids)


@pytest.mark.filterwarnings("ignore:std():UserWarning")
@pytest.mark.parametrize(("groups", "n"), [(1, 300), (2, 40), (50, 8), (7, 7), (3, 1)])
def test_dim_std_is_torchs(groups: int, n: int) -> None:
    rng = np.random.default_rng(groups * 1000 + n)
    for scale in (1e-3, 1.0, 1e4):
        x = (rng.standard_normal((groups, n)) * scale).astype(np.float32)
        expected = torch.tensor(x).std(dim=-1).numpy()
        ours = torch_dim_std(pl.Series(x.reshape(-1)), n).to_numpy()
        assert ours.tobytes() == expected.tobytes() or (
            np.isnan(expected).all() and np.isnan(ours).all()
        )


def test_first_fit_is_in_row_order() -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        lengths = rng.integers(0, 40, int(rng.integers(1, 60))).tolist()
        cap = int(rng.integers(1, 80))
        assert first_fit(lengths, cap) == reference.first_fit(lengths, cap)
    assert first_fit([5, 1, 4, 2, 3, 3, 2, 4], 6) == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("equal_size", [True, False])
def test_differencing_on_float_weights(equal_size: bool) -> None:
    rng = np.random.default_rng(4)
    for _ in range(40):
        k = int(rng.integers(1, 5))
        n = k * int(rng.integers(1, 8)) if equal_size else int(rng.integers(k, 20))
        # FLOPs-like weights: half-integers, some past 2**53 where sums round
        values = (rng.integers(1, 1 << 20, n) * float(1 << 40) + 0.5).tolist()
        ours = karmarkar_karp(values, k, equal_size)
        assert ours == reference.largest_differencing(values, k, equal_size)


@pytest.mark.parametrize("num_experts", [None, 16])
def test_slime_flops_are_the_references(num_experts: int | None) -> None:
    """slime's FLOPs with the multi-latent-attention flags left out of its shape."""
    shape = {
        "num_layers": 80,
        "hidden_size": 8192,
        "ffn_hidden_size": 28672,
        "num_attention_heads": 64,
        "num_query_groups": 8,
        "vocab_size": 152064,
        "num_experts": num_experts,
        "moe_ffn_hidden_size": 1536 if num_experts else None,
        "moe_router_topk": 4 if num_experts else None,
    }
    settings = load_settings(trainer="slime", global_batch_size=1, rollout_batch_size=1, **shape)
    lengths = [1, 9, 4096, 65536]
    ours = forward_flops(np.asarray(lengths), slime_model_shape(settings)).tolist()
    merged = reference.slime_settings({**shape, "kv_channels": 8192 // 64})
    assert ours == [reference.slime_fwd_flops(n, merged) for n in lengths]
